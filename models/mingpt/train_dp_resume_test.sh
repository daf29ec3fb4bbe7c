#!/usr/bin/env bash
# Checkpoints under data parallelism, through //models/mingpt:train: a sharded
# checkpoint saved at world size 4 (FSDP FULL_SHARD, threads) resumes at world
# size 2 with the same global batch and continues with the losses of an
# uninterrupted world-4 run; the same checkpoint resumes under ZeRO-1 at world
# size 1 and under HYBRID_SHARD (and _ZERO2); one saved by two gloo processes through
# //tools:launch resumes on threads; DDP's (single-process format) resumes in
# the single-process loop. Dropout 0: masks depend on each rank's rows.
set -euo pipefail
# The same thread counts in the launched workers as in the one-process runs
# they are compared with (the launcher would give each its share of the
# cores, and bf16 GEMMs round differently with another OpenMP team size).
export FSDP_NUM_THREADS=2 OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2
launch="$1"
train="$2"
source "$3"  # models/common/losses_testing.sh: losses, same_losses
source "$4"  # models/common/cli_testing.sh: exits_2
dir="${TEST_TMPDIR}/dp_resume"
mkdir -p "$dir"
export TMPDIR="$dir/tmp"
mkdir -p "$TMPDIR"

common=(--preset=gpt-nano --data=shipped --steps=6 --seq_len=32 --log_every=1 --dropout=0
        --optimizer=adamw --lr=3e-3)

# Uninterrupted: 6 steps at world 4 (global batch 8).
"$train" "${common[@]}" --world_size=4 --batch_size=2 --strategy=full_shard \
  --metrics_out="$dir/full.jsonl" > "$dir/full.log"

# 3 steps at world 4, then resume at world 2 (batch 4 per rank).
"$train" "${common[@]}" --steps=3 --world_size=4 --batch_size=2 --strategy=full_shard \
  --checkpoint_dir="$dir/ck" > "$dir/first.log"
[[ "$(cat "$dir/ck/latest")" == step_000003 ]]
grep -q "^saved checkpoint $dir/ck/step_000003 (" "$dir/first.log"  # rank 0 says it, once
[[ $(grep -c "^saved checkpoint" "$dir/first.log") == 1 ]]
ls "$dir/ck/step_000003/index.json" "$dir/ck/step_000003/shard_3_of_4.safetensors" > /dev/null
cp -r "$dir/ck" "$dir/ck_copy"  # the resumed runs below write step_000006 into their own copies
"$train" "${common[@]}" --world_size=2 --batch_size=4 --strategy=full_shard \
  --checkpoint_dir="$dir/ck" --resume=latest --metrics_out="$dir/resumed.jsonl" > "$dir/resumed.log"
grep -q "resumed from $dir/ck/step_000003 at step 3" "$dir/resumed.log"
[[ $(losses "$dir/resumed.jsonl" | head -1 | cut -d' ' -f1) == 4 ]]
same_losses "$dir/full.jsonl" "$dir/resumed.jsonl" "full_shard world 4 -> 2"
echo "world 4 -> 2: the losses of the uninterrupted run"

# The same checkpoint under ZeRO-1 at world 1, and HYBRID_SHARD (2 groups of 2).
"$train" "${common[@]}" --world_size=1 --batch_size=8 --strategy=zero1 \
  --resume="$dir/ck_copy/step_000003" --metrics_out="$dir/zero1.jsonl" > "$dir/zero1.log"
same_losses "$dir/full.jsonl" "$dir/zero1.jsonl" "full_shard world 4 -> zero1 world 1"
"$train" "${common[@]}" --world_size=4 --batch_size=2 --strategy=hybrid_shard \
  --hybrid_shard_group_size=2 --auto_wrap=none --resume="$dir/ck_copy/step_000003" \
  --metrics_out="$dir/hybrid.jsonl" > "$dir/hybrid.log"
same_losses "$dir/full.jsonl" "$dir/hybrid.jsonl" "full_shard -> hybrid_shard (no wrap)"
"$train" "${common[@]}" --world_size=4 --batch_size=2 --strategy=hybrid_shard_zero2 \
  --hybrid_shard_group_size=2 --resume="$dir/ck_copy/step_000003" \
  --metrics_out="$dir/hybrid_zero2.jsonl" > "$dir/hybrid_zero2.log"
grep -q "FSDP HYBRID_SHARD_ZERO2, 4 units (auto_wrap transformer)" "$dir/hybrid_zero2.log"
same_losses "$dir/full.jsonl" "$dir/hybrid_zero2.jsonl" "full_shard -> hybrid_shard_zero2"
echo "full_shard checkpoint -> zero1 world 1, hybrid_shard and hybrid_shard_zero2: the same losses"

# Saved by two gloo processes through the launcher, resumed on threads.
"$launch" --nproc_per_node=2 --rdzv_endpoint=127.0.0.1:29541 -- \
  "$train" "${common[@]}" --steps=3 --batch_size=4 --backend=gloo --strategy=shard_grad_op \
  --checkpoint_dir="$dir/ck_gloo" > "$dir/gloo.log" 2>&1 ||
  { echo "gloo run failed:"; cat "$dir/gloo.log"; exit 1; }
"$train" "${common[@]}" --world_size=4 --batch_size=2 --strategy=full_shard \
  --checkpoint_dir="$dir/ck_gloo" --resume=latest --metrics_out="$dir/from_gloo.jsonl" \
  > "$dir/from_gloo.log"
same_losses "$dir/full.jsonl" "$dir/from_gloo.jsonl" "gloo shard_grad_op -> threads full_shard"
echo "gloo processes -> threads: the same losses"

# DDP writes the single-process format, which the plain loop resumes.
"$train" "${common[@]}" --steps=3 --world_size=2 --batch_size=4 --strategy=ddp \
  --checkpoint_dir="$dir/ck_ddp" > "$dir/ddp.log"
ls "$dir/ck_ddp/step_000003/model.safetensors" > /dev/null
"$train" "${common[@]}" --batch_size=8 --checkpoint_dir="$dir/ck_ddp" --resume=latest \
  --metrics_out="$dir/from_ddp.jsonl" > "$dir/from_ddp.log"
same_losses "$dir/full.jsonl" "$dir/from_ddp.jsonl" "ddp world 2 -> one process"
echo "ddp -> one process: the same losses"

# Mismatches are clear errors (exit 2).
exits_2 "is sharded (FSDP or ZeRO-1); resume it with an FSDP strategy" \
  "$train" "${common[@]}" --world_size=2 --batch_size=4 --strategy=ddp \
  --resume="$dir/ck_copy/step_000003"
# One process (no --strategy) given a sharded checkpoint: what it is and how to resume it.
exits_2 "is sharded (index.json: saved by FSDP or ZeRO-1); resume it with an FSDP strategy" \
  "$train" "${common[@]}" --batch_size=8 --resume="$dir/ck_copy/step_000003"
exits_2 "resume it with --strategy=ddp or --world_size=1, or turn it into a sharded one that \
FSDP and ZeRO-1 resume at any world size with \`checkpoint shard $dir/ck_ddp/step_000003 OUT\`" \
  "$train" "${common[@]}" --world_size=2 --batch_size=4 --strategy=full_shard \
  --resume="$dir/ck_ddp/step_000003"
# A sharded step folder without its index.json: said as such, in one process
# and under FSDP (exit 1: the data is damaged, not the flags).
cp -r "$dir/ck_copy/step_000003" "$dir/no_index"
rm "$dir/no_index/index.json"
for run in "--batch_size=8" "--world_size=2 --batch_size=4 --strategy=full_shard"; do
  set +e
  # shellcheck disable=SC2086
  "$train" "${common[@]}" $run --resume="$dir/no_index" > /dev/null 2> "$dir/no_index.err"
  code=$?
  set -e
  shards="shard_0_of_4.safetensors, shard_1_of_4.safetensors, shard_2_of_4.safetensors, \
shard_3_of_4.safetensors"
  [[ $code == 1 ]] && grep -qF "checkpoint $dir/no_index holds the shard files of a sharded \
checkpoint ($shards) but no index.json" "$dir/no_index.err" ||
    { echo "$run without index.json: exit $code"; cat "$dir/no_index.err"; exit 1; }
done
exits_2 "checkpoint $dir/ck_copy/step_000003: [" \
  "$train" "${common[@]}" --world_size=2 --batch_size=2 --strategy=full_shard \
  --resume="$dir/ck_copy/step_000003"
exits_2 "the global batch differs (saved 8 rows, now 4): resume with 8 = ranks x" \
  "$train" "${common[@]}" --world_size=2 --batch_size=2 --strategy=full_shard \
  --resume="$dir/ck_copy/step_000003"
# Another model is refused before any shard is read, naming the fields that
# differ (sharded, and the single-process format under DDP).
# (From index.json alone: a copy with a shard cut short says the same.)
cp -r "$dir/ck_copy/step_000003" "$dir/cut_shard"
truncate -s 100 "$dir/cut_shard/shard_0_of_4.safetensors"
exits_2 "(n_layer 3 there, 4 here; n_head 3 there, 4 here; n_embd 48 there, 128 here)" \
  "$train" "${common[@]}" --preset=gpt-micro --world_size=4 --batch_size=2 \
  --strategy=full_shard --resume="$dir/cut_shard"
exits_2 "(n_layer 3 there, 4 here; n_head 3 there, 4 here; n_embd 48 there, 128 here)" \
  "$train" "${common[@]}" --preset=gpt-micro --world_size=2 --batch_size=4 --strategy=ddp \
  --resume="$dir/ck_ddp/step_000003"
# A checkpoint directory as --resume: its latest step.
"$train" "${common[@]}" --world_size=4 --batch_size=2 --strategy=full_shard --steps=4 \
  --resume="$dir/ck_copy" > "$dir/from_directory.log"
grep -q "resumed from $dir/ck_copy/step_000003 at step 3" "$dir/from_directory.log"
# A refused resume does not say it resumed.
"$train" "${common[@]}" --world_size=2 --batch_size=2 --strategy=full_shard \
  --resume="$dir/ck_copy/step_000003" > "$dir/refused.log" 2> /dev/null || true
if grep -q "resumed from" "$dir/refused.log"; then
  echo "a refused resume printed 'resumed from'"; exit 1
fi
echo "mismatched resumes are refused"
