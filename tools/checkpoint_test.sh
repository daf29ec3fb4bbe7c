#!/usr/bin/env bash
# //tools:checkpoint on checkpoints written by //models/mingpt:train:
#   - info and verify on sharded (FSDP, ZeRO-1) and single-process (DDP) ones;
#   - an FSDP world-2 checkpoint consolidated into the single-process format
#     resumes in one process and under DDP with the losses of the
#     uninterrupted FSDP run (1e-5), and so does a ZeRO-1 one;
#   - shard (the reverse): DDP's checkpoint resumes under FSDP (world 2) and
#     ZeRO-1 (world 4) with the full run's losses; shard + consolidate gives
#     DDP's model and optimizer state back;
#   - diff: the consolidated model equals the sharded one bit for bit, DDP's
#     equals FSDP's within 1e-5 after the same steps (bit for bit here: two
#     ranks sum in one order), later steps and another model differ;
#   - errors: a corrupted shard and a NaN (verify exit 1, naming them), a non-empty
#     output folder, a single-process input to consolidate, bad commands (exit 2).
set -euo pipefail
train="$1"
ckpt="$2"
source "$3"  # models/common/losses_testing.sh: losses, same_losses
dir="${TEST_TMPDIR}/checkpoint_tool"
rm -rf "$dir"
mkdir -p "$dir"

common=(--preset=gpt-nano --data=shipped --steps=6 --seq_len=32 --log_every=1 --dropout=0
        --optimizer=adamw --lr=3e-3)
# expect CODE PATTERN COMMAND...: exits CODE and prints PATTERN (stdout or stderr).
expect() {
  local code="$1" pattern="$2"
  shift 2
  set +e
  "$@" > "$dir/out.txt" 2>&1
  local got=$?
  set -e
  if [[ $got != "$code" ]] || ! grep -q -- "$pattern" "$dir/out.txt"; then
    echo "expected exit $code and '$pattern' from: $*; got $got:"; cat "$dir/out.txt"; exit 1
  fi
}

# Uninterrupted: 6 FSDP steps at world 2 (global batch 8).
"$train" "${common[@]}" --world_size=2 --batch_size=4 --strategy=full_shard \
  --checkpoint_dir="$dir/ck_full" --metrics_out="$dir/full.jsonl" > "$dir/full.log"
# 3 steps, saved sharded.
"$train" "${common[@]}" --steps=3 --world_size=2 --batch_size=4 --strategy=full_shard \
  --checkpoint_dir="$dir/ck" > "$dir/first.log"

# info (the checkpoint directory resolves to its latest step) and verify.
expect 0 "sharded, written by fsdp (FULL_SHARD) at world size 2" "$ckpt" info "$dir/ck"
grep -q "step:        3" "$dir/out.txt"
grep -q "config:.*gpt-nano" "$dir/out.txt"
grep -q "optimizer:   adamw (exp_avg, exp_avg_sq), step 3" "$dir/out.txt"
grep -q "shard_1_of_2.safetensors" "$dir/out.txt"
expect 0 "lm_head.weight" "$ckpt" info --params "$dir/ck/step_000003"
expect 0 "^OK .*every stored checksum matches; no NaN or Inf" "$ckpt" verify "$dir/ck"
echo "info, verify: sharded"

# Consolidated, it resumes in one process and under DDP with the losses of the full run.
# (OUT/ is OUT: the temporary folder goes beside it.)
expect 0 "wrote $dir/one/model.safetensors" "$ckpt" consolidate "$dir/ck" "$dir/one/"
expect 0 "kind:        single-process" "$ckpt" info "$dir/one"
grep -q "optimizer:   adamw (exp_avg, exp_avg_sq), step 3" "$dir/out.txt"
expect 0 "^OK " "$ckpt" verify "$dir/one"
expect 0 "^SAME: .* 0 differ" "$ckpt" diff "$dir/one" "$dir/ck"
cp -r "$dir/one" "$dir/one_copy"
"$train" "${common[@]}" --batch_size=8 --resume="$dir/one" \
  --metrics_out="$dir/single.jsonl" > "$dir/single.log"
grep -q "resumed from $dir/one at step 3" "$dir/single.log"
same_losses "$dir/full.jsonl" "$dir/single.jsonl" "fsdp world 2 -> consolidated -> one process"
"$train" "${common[@]}" --world_size=2 --batch_size=4 --strategy=ddp --resume="$dir/one_copy" \
  --metrics_out="$dir/ddp_resumed.jsonl" > "$dir/ddp_resumed.log"
same_losses "$dir/full.jsonl" "$dir/ddp_resumed.jsonl" "fsdp world 2 -> consolidated -> ddp"
echo "consolidated FSDP checkpoint: one process and DDP continue with the full run's losses"

# ZeRO-1 too.
"$train" "${common[@]}" --steps=3 --world_size=2 --batch_size=4 --strategy=zero1 \
  --checkpoint_dir="$dir/ck_zero1" > "$dir/zero1.log"
expect 0 "written by zero1 (ZERO1) at world size 2" "$ckpt" info "$dir/ck_zero1"
expect 0 "wrote" "$ckpt" consolidate "$dir/ck_zero1/step_000003" "$dir/new/parents/one_zero1"
mv "$dir/new/parents/one_zero1" "$dir/one_zero1"
"$train" "${common[@]}" --batch_size=8 --resume="$dir/one_zero1" \
  --metrics_out="$dir/from_zero1.jsonl" > "$dir/from_zero1.log"
same_losses "$dir/full.jsonl" "$dir/from_zero1.jsonl" "zero1 world 2 -> consolidated -> one process"
echo "consolidated ZeRO-1 checkpoint: the same"

# diff: DDP's model after 3 steps against FSDP's, and against another model.
"$train" "${common[@]}" --steps=3 --world_size=2 --batch_size=4 --strategy=ddp \
  --checkpoint_dir="$dir/ck_ddp" > "$dir/ddp.log"
expect 0 "kind:        single-process" "$ckpt" info "$dir/ck_ddp"
expect 0 "^OK " "$ckpt" verify "$dir/ck_ddp"
expect 0 "^SAME: " "$ckpt" diff --atol=1e-5 --rtol=1e-5 "$dir/ck_ddp" "$dir/ck"
# Three more steps move every parameter; a loose tolerance lets them pass.
expect 1 "^DIFFERENT: 41 parameters compared (115632 elements), 41 differ" \
  "$ckpt" diff --top=3 "$dir/ck" "$dir/ck_full"
grep -q "\.\.\. 38 more" "$dir/out.txt"
expect 0 "^SAME: .* 41 differ" "$ckpt" diff --atol=1 "$dir/ck" "$dir/ck_full"
"$train" --preset=gpt-nano --data=shipped --steps=1 --seq_len=32 --dropout=0 --vocab_size=300 \
  --checkpoint_dir="$dir/ck_other" > "$dir/other.log"
expect 1 "MISMATCH 'transformer.wte.weight' is (300,48) f32 in A" \
  "$ckpt" diff "$dir/ck_other" "$dir/ck"
grep -q "name/shape mismatches" "$dir/out.txt"
# Another architecture: nothing in common, said once; the mismatches listed up to --top.
"$train" --preset=gpt-micro --data=shipped --steps=1 --seq_len=32 --dropout=0 \
  --checkpoint_dir="$dir/ck_micro" > /dev/null
expect 1 "no parameter of the same name and shape in both" \
  "$ckpt" diff --top=2 "$dir/ck_micro" "$dir/ck"
[[ $(grep -c "MISMATCH" "$dir/out.txt") == 2 ]] && grep -q "more mismatches" "$dir/out.txt" ||
  { cat "$dir/out.txt"; echo "--top bounds the mismatches"; exit 1; }
expect 2 "--top=-1 must be >= 0" "$ckpt" diff --top=-1 "$dir/ck" "$dir/ck"
echo "diff: ddp = fsdp within 1e-5; later steps and another model differ"

# shard: DDP's checkpoint as a sharded one resumes under FSDP (world 2) and ZeRO-1 (world 4).
expect 0 "wrote the sharded checkpoint $dir/from_ddp (world size 1)" \
  "$ckpt" shard "$dir/ck_ddp" "$dir/from_ddp"
expect 0 "converted from a single-process checkpoint" "$ckpt" info "$dir/from_ddp"
grep -q "optimizer:   adamw (exp_avg, exp_avg_sq), step 3" "$dir/out.txt"
expect 0 "^OK " "$ckpt" verify "$dir/from_ddp"
expect 0 "^SAME: .* 0 differ" "$ckpt" diff "$dir/from_ddp" "$dir/ck_ddp"
cp -r "$dir/from_ddp" "$dir/from_ddp_copy"
"$train" "${common[@]}" --world_size=2 --batch_size=4 --strategy=full_shard \
  --resume="$dir/from_ddp" --metrics_out="$dir/fsdp_from_ddp.jsonl" > "$dir/fsdp_from_ddp.log"
same_losses "$dir/full.jsonl" "$dir/fsdp_from_ddp.jsonl" "ddp -> shard -> fsdp world 2"
"$train" "${common[@]}" --world_size=4 --batch_size=2 --strategy=zero1 \
  --resume="$dir/from_ddp_copy" --metrics_out="$dir/zero1_from_ddp.jsonl" > "$dir/zero1_from_ddp.log"
same_losses "$dir/full.jsonl" "$dir/zero1_from_ddp.jsonl" "ddp -> shard -> zero1 world 4"
# Round trip: shard then consolidate gives DDP's files back (model and optimizer state).
"$ckpt" consolidate "$dir/from_ddp_copy" "$dir/round_trip" > /dev/null
expect 0 "^SAME: .* 0 differ" "$ckpt" diff "$dir/round_trip" "$dir/ck_ddp"
python3 - "$dir/round_trip/optimizer.safetensors" "$dir/ck_ddp/step_000003/optimizer.safetensors" <<'PY'
import json, struct, sys
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    data = b[8 + n:]
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in h.items() if k != "__metadata__"}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
for k in a:
    assert a[k][1] == b[k][1] and (a[k][2] == b[k][2] or k.endswith(".step")), k
PY
echo "shard: ddp checkpoint resumes under fsdp and zero1; shard + consolidate round-trips"

# Errors.
expect 2 "is not empty" "$ckpt" consolidate "$dir/ck" "$dir/one_zero1"
expect 2 "is not a sharded checkpoint (no index.json): it is a single-process one already \
(model.safetensors, as one process, DDP and ZeRO-1 save)" "$ckpt" consolidate "$dir/ck_ddp" "$dir/x"
[[ ! -e "$dir/x" ]]
expect 2 "is already sharded" "$ckpt" shard "$dir/ck" "$dir/z"
expect 2 "--buffers='bn.running_mean,' has an empty entry" "$ckpt" shard "$dir/ck_ddp" "$dir/z" \
  --buffers=bn.running_mean,
expect 2 "usage: checkpoint info DIR" "$ckpt" frobnicate "$dir/ck"
expect 2 "usage:" "$ckpt" info
expect 2 "--atol=-1 must be finite and >= 0" "$ckpt" diff "$dir/ck" "$dir/ck" --atol=-1
expect 2 "--rtol=inf must be finite and >= 0" "$ckpt" diff "$dir/ck" "$dir/ck" --rtol=inf
expect 2 "--atol=nan must be finite and >= 0" "$ckpt" diff "$dir/ck" "$dir/ck" --atol=nan
expect 2 "is not a folder" "$ckpt" info "$dir/nope"
mkdir -p "$dir/plain"
expect 2 "$dir/plain is not a checkpoint (no model.safetensors or index.json in it) nor a" \
  "$ckpt" info "$dir/plain"
expect 2 "$dir/plain is not a checkpoint" "$ckpt" diff "$dir/ck" "$dir/plain"
expect 2 "unknown command 'frobnicate'" "$ckpt" frobnicate "$dir/plain"  # the command first
mkdir -p "$dir/dangling" && echo step_000009 > "$dir/dangling/latest"
expect 2 "$dir/dangling/latest names step_000009, which is missing" "$ckpt" info "$dir/dangling"
expect 1 "FAILED $dir/dangling: $dir/dangling/latest names step_000009, which is missing" \
  "$ckpt" verify "$dir/dangling"
expect 1 "FAILED $dir/plain" "$ckpt" verify "$dir/plain"  # verify's own report, exit 1
# corrupt FILE: overwrites a byte inside its last tensor's data (9 bytes before the end).
corrupt() {
  local size
  size=$(stat -c %s "$1")
  printf '\x7f' | dd of="$1" bs=1 seek=$((size - 9)) conv=notrunc status=none
}
cp -r "$dir/ck/step_000003" "$dir/broken"
corrupt "$dir/broken/shard_1_of_2.safetensors"
expect 1 "FAILED .*shard_1_of_2.safetensors' is corrupted" "$ckpt" verify "$dir/broken"
expect 2 "is corrupted" "$ckpt" consolidate "$dir/broken" "$dir/y"
[[ ! -e "$dir/y" && ! -e "$dir/y.tmp-consolidate" ]]
# A single-process folder with a flipped byte in its optimizer state: verify and shard name it,
# and shard writes nothing.
cp -r "$dir/ck_ddp/step_000003" "$dir/broken_one"
corrupt "$dir/broken_one/optimizer.safetensors"
expect 1 "FAILED .*optimizer.safetensors' is corrupted" "$ckpt" verify "$dir/broken_one"
expect 2 "optimizer.safetensors' is corrupted" "$ckpt" shard "$dir/broken_one" "$dir/w"
[[ ! -e "$dir/w" ]]
# Another save's optimizer state (a consolidated copy of this step) beside this model: verify
# names the two saves.
cp -r "$dir/ck_ddp/step_000003" "$dir/mixed"
cp "$dir/round_trip/optimizer.safetensors" "$dir/mixed/optimizer.safetensors"
expect 1 "model.safetensors and optimizer.safetensors are of different saves" "$ckpt" verify \
  "$dir/mixed"
expect 2 "model.safetensors and optimizer.safetensors are of different saves" "$ckpt" shard \
  "$dir/mixed" "$dir/mixed_sharded"
[[ ! -e "$dir/mixed_sharded" ]]
# A NaN in a model (a file written by hand: safetensors without this framework's checksum).
mkdir -p "$dir/nan"
python3 - "$dir/nan" <<'PY'
import json, struct, sys
def write(path, tensors, meta):
    header, data = {"__metadata__": meta}, b""
    for name, values in tensors.items():
        raw = struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": "F32", "shape": [len(values)], "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)
write(sys.argv[1] + "/model.safetensors", {"w": [1.0, float("nan"), float("inf")], "b": [0.0]}, {"fsdp.step": "1"})
write(sys.argv[1] + "/optimizer.safetensors", {}, {"optimizer": "sgd"})
PY
expect 1 "model.safetensors 'w' has 2 NaN or infinite values" "$ckpt" verify "$dir/nan"
# Bytes appended to a file: no tensor's, refused.
cp -r "$dir/ck_ddp/step_000003" "$dir/appended" && printf 'xyz' >> "$dir/appended/model.safetensors"
expect 1 "FAILED .*3 bytes follow the last tensor's data" "$ckpt" verify "$dir/appended"
# The model alone (optimizer.safetensors removed to keep it): info and verify say it does not
# resume, export-hf takes it, shard refuses it naming --init_from.
cp -r "$dir/ck_ddp/step_000003" "$dir/model_only" && rm "$dir/model_only/optimizer.safetensors"
expect 0 "optimizer:   none: no optimizer.safetensors" "$ckpt" info "$dir/model_only"
expect 0 "^OK .*the model alone (no optimizer.safetensors: removed on purpose, or a copy cut short): it does not resume" "$ckpt" verify \
  "$dir/model_only"
expect 0 "GPT-2" "$ckpt" export-hf "$dir/model_only" "$dir/model_only_hf"
[[ -s "$dir/model_only_hf/model.safetensors" ]]
expect 2 "holds the model alone .*--init_from=$dir/model_only" "$ckpt" shard "$dir/model_only" \
  "$dir/model_only_sharded"
[[ ! -e "$dir/model_only_sharded" ]]
expect 1 "FAILED $dir/nope" "$ckpt" verify "$dir/nope"
echo "errors: named, exit codes 1 / 2, nothing written"
echo PASS
