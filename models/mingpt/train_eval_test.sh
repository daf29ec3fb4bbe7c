#!/usr/bin/env bash
# Evaluation through //models/mingpt:train: --eval_data evaluates the loss on
# held-out data every --eval_every steps and after the last (printed and in
# --metrics_out), in eval mode, without changing training (the same training
# losses with dropout on); ranks evaluate their rows of the same batches, so
# FSDP at world 2 with 2 micro-batches reports one process's eval losses; under
# DDP with bf16 a checkpoint saved after evaluations holds the fp32
# masters, bit for bit those of a run without evaluation; bad values exit 2
# naming the flag. --val_fraction holds out the end of --data: the same as
# the two parts given as --data and --eval_data.
set -euo pipefail
train="$1"
source "$2"  # models/common/losses_testing.sh: losses, same_losses
checkpoint="$3"
dir="${TEST_TMPDIR}/eval"
mkdir -p "$dir"
evals() { sed -nE 's/.*"step":([0-9]+),"eval_loss":([0-9.]+).*/\1 \2/p' "$1"; }
train_losses() { sed -nE 's/.*"step":([0-9]+),"loss":([0-9.]+).*/\1 \2/p' "$1"; }

common=(--preset=gpt-nano --data=shipped --steps=6 --seq_len=32 --log_every=1
        --optimizer=adamw --lr=3e-3)

# Dropout on: evaluating (dropout off) leaves training as it was.
"$train" "${common[@]}" --batch_size=4 --dropout=0.1 --metrics_out="$dir/plain.jsonl" > /dev/null
"$train" "${common[@]}" --batch_size=4 --dropout=0.1 --eval_data=shipped --eval_every=3 \
  --metrics_out="$dir/evaluated.jsonl" > "$dir/evaluated.log"
diff <(train_losses "$dir/plain.jsonl") <(train_losses "$dir/evaluated.jsonl")
[[ $(train_losses "$dir/plain.jsonl" | wc -l) == 6 ]]
[[ "$(evals "$dir/evaluated.jsonl" | cut -d' ' -f1 | tr '\n' ' ')" == "3 6 " ]]
grep -Eq "^eval after step 6 \| loss [0-9.]+ \|" "$dir/evaluated.log"
# The eval loss falls as the model learns.
awk '{ l[NR] = $2 } END { exit !(l[2] < l[1]) }' <(evals "$dir/evaluated.jsonl")
echo "evaluation after steps 3 and 6; the training losses unchanged"

# Ranks evaluate their rows: FSDP world 2, 2 micro-batches of 1 = one process, batch 4.
"$train" "${common[@]}" --batch_size=4 --dropout=0 --eval_data=shipped --eval_every=2 \
  --metrics_out="$dir/one.jsonl" > /dev/null
"$train" "${common[@]}" --batch_size=1 --grad_accum_steps=2 --world_size=2 --dropout=0 \
  --strategy=full_shard --eval_data=shipped --eval_every=2 --metrics_out="$dir/fsdp.jsonl" > /dev/null
[[ $(evals "$dir/fsdp.jsonl" | wc -l) == 3 ]]
join <(evals "$dir/one.jsonl") <(evals "$dir/fsdp.jsonl") | awk '
  { d = $2 - $3; if (d < 0) d = -d; if (d > 1e-5 * $2) { print "eval after step " $1 ": " $2 " vs " $3; bad = 1 } n++ }
  END { exit bad || n != 3 }'
echo "FSDP world 2 with micro-batches evaluates as one process"

# DDP, bf16: the checkpoint after evaluations (at steps 2 and 4; the step's
# checkpoint is saved before its evaluation) is the run's fp32 masters.
bf16=(--steps=4 --batch_size=2 --world_size=2 --strategy=ddp --precision=bf16 --dropout=0)
"$train" "${common[@]}" "${bf16[@]}" --eval_data=shipped --eval_every=2 \
  --checkpoint_dir="$dir/ck_eval" > /dev/null
"$train" "${common[@]}" "${bf16[@]}" --checkpoint_dir="$dir/ck_plain" > /dev/null
"$checkpoint" diff "$dir/ck_eval" "$dir/ck_plain" --atol=0 --rtol=0 > "$dir/diff.txt" ||
  { echo "checkpoint after an evaluation differs:"; cat "$dir/diff.txt"; exit 1; }
echo "DDP bf16: the checkpoint after an evaluation equals one without"

# --val_fraction: the last quarter of a text is held out. Training on the
# first three quarters and evaluating on the last equals a run on the two
# parts as separate files (the same windows: the same seeds and lengths).
awk 'BEGIN { srand(5); for (i = 0; i < 5000; i++) printf "%c", 97 + int(rand() * 26) }' \
  > "$dir/all.txt"  # 5000 bytes
head -c 3750 "$dir/all.txt" > "$dir/head.txt"
tail -c 1250 "$dir/all.txt" > "$dir/tail.txt"
split=(--preset=gpt-nano --steps=4 --seq_len=32 --batch_size=4 --log_every=1 --dropout=0
       --eval_every=2)
"$train" "${split[@]}" --data="$dir/all.txt" --val_fraction=0.25 \
  --metrics_out="$dir/split.jsonl" > "$dir/split.log"
grep -q "data: bytes \[0, 3750) of $dir/all.txt (3750 bytes)" "$dir/split.log"
grep -qF "eval: bytes [3750, 5000) of $dir/all.txt (1250 bytes) | 4 batches every 2 steps and after the last" "$dir/split.log"
"$train" "${split[@]}" --data="$dir/head.txt" --eval_data="$dir/tail.txt" \
  --metrics_out="$dir/files.jsonl" > /dev/null
diff <(train_losses "$dir/split.jsonl") <(train_losses "$dir/files.jsonl")
diff <(evals "$dir/split.jsonl") <(evals "$dir/files.jsonl")
[[ $(evals "$dir/split.jsonl" | wc -l) == 2 ]]
echo "--val_fraction=0.25 trains on the first 3750 bytes and evaluates on the last 1250"

# Bad values: exit 2, the flag named.
bad_flag() {  # bad_flag WANT FLAGS...
  local want="$1" code
  shift
  set +e
  "$train" "${common[@]}" --steps=1 "$@" > /dev/null 2> "$dir/err.txt"; code=$?
  set -e
  [[ $code == 2 ]] && grep -qF -- "$want" "$dir/err.txt" ||
    { echo "expected exit 2 and '$want', got $code:"; cat "$dir/err.txt"; exit 1; }
}
bad_flag "--eval_every=-1 must be >= 0" --eval_data=shipped --eval_every=-1
bad_flag "--eval_batches=0 must be >= 1" --eval_data=shipped --eval_batches=0
bad_flag "--eval_data=$dir/missing.bin" --eval_data="$dir/missing.bin"
bad_flag "--eval_data=random: its vocabulary 50257 is not the training data's 256" --eval_data=random
bad_flag "--val_fraction=0.99995: the training part (the first 5e-05 of --data): [lm loader]" \
  --val_fraction=0.99995
bad_flag "--val_fraction=1: must be in [0, 1)" --val_fraction=1
bad_flag "--val_fraction=0.9999999: holds out" --val_fraction=0.9999999  # not said as 1
bad_flag "--val_fraction=0.1: holds out part of --data for evaluation, and --eval_data=shipped" \
  --val_fraction=0.1 --eval_data=shipped
bad_flag "--val_fraction=0.1: random tokens" --data=random --val_fraction=0.1
bad_flag "--val_fraction=1e-09: holds out 0 of the 567198 tokens" --val_fraction=1e-9
# A held-out part shorter than a batch: the loader's error names --val_fraction, not --eval_data.
bad_flag "--val_fraction=1e-05: [lm loader]" --val_fraction=0.00001
echo "bad values are named"
