#!/usr/bin/env bash
# Gradient accumulation through //models/mingpt:train: --grad_accum_steps=K
# micro-batches of --batch_size=B give the losses of one step on K*B rows, in
# one process and under data parallelism (DDP, ZeRO-1, FSDP FULL_SHARD at
# world 2, K*2*B the global batch); a checkpoint saved with accumulation
# resumes without it at the same global batch (and the reverse) with the
# uninterrupted run's losses; a bad value exits 2 naming the flag. With
# dropout: its masks are a function of the step and the global row, however
# the rows are split into ranks and micro-batches.
set -euo pipefail
train="$1"
source "$2"  # models/common/losses_testing.sh: losses, same_losses
dir="${TEST_TMPDIR}/grad_accum"
mkdir -p "$dir"

common=(--preset=gpt-nano --data=shipped --steps=6 --seq_len=32 --log_every=1 --dropout=0.1
        --optimizer=adamw --lr=3e-3)

# Reference: one process, batch 8.
"$train" "${common[@]}" --batch_size=8 --metrics_out="$dir/ref.jsonl" > "$dir/ref.log"

# One process, 4 micro-batches of 2: the same losses; a quarter of the activations.
"$train" "${common[@]}" --batch_size=2 --grad_accum_steps=4 --metrics_out="$dir/k4.jsonl" \
  > "$dir/k4.log"
grep -q "| 4 micro-batches x batch 2 x 32 tokens" "$dir/k4.log"
same_losses "$dir/ref.jsonl" "$dir/k4.jsonl" "one process, 4 micro-batches of 2"
act() { grep "^step     1 |" "$1" | sed -E 's/.* act ([0-9.]+) .*/\1/'; }
awk -v a="$(act "$dir/k4.log")" -v b="$(act "$dir/ref.log")" 'BEGIN { exit !(a < b) }' ||
  { echo "activations with micro-batches of 2 ($(act "$dir/k4.log") MiB) not below batch 8's"; exit 1; }
echo "one process: 4 micro-batches of 2 = batch 8"

# World 2, 2 micro-batches of 2 per rank, each strategy.
for strategy in ddp zero1 full_shard; do
  "$train" "${common[@]}" --world_size=2 --batch_size=2 --grad_accum_steps=2 \
    --strategy="$strategy" --metrics_out="$dir/$strategy.jsonl" > "$dir/$strategy.log"
  same_losses "$dir/ref.jsonl" "$dir/$strategy.jsonl" "$strategy world 2, 2 micro-batches of 2"
done
grep -q "2 ranks (threads) x 2 micro-batches x batch 2 x 32 tokens" "$dir/full_shard.log"
echo "world 2 (ddp, zero1, full_shard): 2 micro-batches of 2 per rank = batch 8"

# Saved with accumulation (FSDP world 2, K 2), resumed without it (world 2,
# batch 4), and the single-process format saved without it (batch 8),
# resumed with it (K 4 of 2).
"$train" "${common[@]}" --steps=3 --world_size=2 --batch_size=2 --grad_accum_steps=2 \
  --strategy=full_shard --checkpoint_dir="$dir/ck_fsdp" > /dev/null
"$train" "${common[@]}" --world_size=2 --batch_size=4 --strategy=full_shard \
  --checkpoint_dir="$dir/ck_fsdp" --resume=latest --metrics_out="$dir/resumed_fsdp.jsonl" \
  > /dev/null
[[ $(losses "$dir/resumed_fsdp.jsonl" | head -1 | cut -d' ' -f1) == 4 ]]
same_losses "$dir/ref.jsonl" "$dir/resumed_fsdp.jsonl" "full_shard K 2 -> K 1"
"$train" "${common[@]}" --steps=3 --batch_size=8 --checkpoint_dir="$dir/ck_one" > /dev/null
"$train" "${common[@]}" --batch_size=2 --grad_accum_steps=4 --checkpoint_dir="$dir/ck_one" \
  --resume=latest --metrics_out="$dir/resumed_one.jsonl" > /dev/null
same_losses "$dir/ref.jsonl" "$dir/resumed_one.jsonl" "one process K 1 -> K 4"
echo "checkpoints resume across accumulation settings at the same global batch"

# Another global batch is refused; a bad value exits 2 naming the flag.
set +e
"$train" "${common[@]}" --batch_size=2 --grad_accum_steps=2 --checkpoint_dir="$dir/ck_one" \
  --resume=latest > /dev/null 2> "$dir/err1.txt"; code=$?
set -e
[[ $code == 2 ]] || { echo "resuming at another global batch: exit $code"; cat "$dir/err1.txt"; exit 1; }
grep -q "global_batch=8" "$dir/err1.txt" ||
  { echo "expected the saved global batch in:"; cat "$dir/err1.txt"; exit 1; }
set +e
"$train" "${common[@]}" --grad_accum_steps=0 > /dev/null 2> "$dir/err2.txt"; code=$?
set -e
[[ $code == 2 ]] || { echo "--grad_accum_steps=0: exit $code"; cat "$dir/err2.txt"; exit 1; }
grep -q "\-\-grad_accum_steps=0 must be >= 1" "$dir/err2.txt" ||
  { echo "expected the flag named in:"; cat "$dir/err2.txt"; exit 1; }
echo "bad values are named"
