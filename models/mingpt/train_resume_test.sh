#!/usr/bin/env bash
# --resume continues with exactly the losses of an uninterrupted run, with
# dropout on; a corrupted checkpoint is a clear error; bad flags are errors.
set -euo pipefail
train="$1"
dir="${TEST_TMPDIR}/resume"
mkdir -p "$dir"
common=(--preset=gpt-nano --steps=6 --batch_size=4 --seq_len=32 --dropout=0.1 --log_every=1)

losses() { sed -E 's/.*"step":([0-9]+),"loss":([0-9.]+).*/\1 \2/' "$1"; }

"$train" "${common[@]}" --metrics_out="$dir/full.jsonl" > "$dir/full.log"
"$train" "${common[@]}" --steps=3 --checkpoint_dir="$dir/ckpt" --metrics_out="$dir/part1.jsonl" > /dev/null
"$train" "${common[@]}" --checkpoint_dir="$dir/ckpt" --resume=latest \
  --metrics_out="$dir/part2.jsonl" > "$dir/resumed.log"
grep -q "resumed from .*step_000003 at step 3" "$dir/resumed.log"

diff <(losses "$dir/full.jsonl") <(cat <(losses "$dir/part1.jsonl") <(losses "$dir/part2.jsonl"))
[[ $(losses "$dir/full.jsonl" | wc -l) == 6 ]]
echo "resumed losses equal the uninterrupted run's:"
losses "$dir/full.jsonl"

# The loss falls over the 6 steps.
first=$(losses "$dir/full.jsonl" | head -1 | cut -d' ' -f2)
last=$(losses "$dir/full.jsonl" | tail -1 | cut -d' ' -f2)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }'

# A corrupted checkpoint is refused with a message naming the file.
model="$dir/ckpt/step_000006/model.safetensors"
printf '\x01' | dd of="$model" bs=1 seek=$(( $(stat -c %s "$model") - 5 )) conv=notrunc 2>/dev/null
if "$train" "${common[@]}" --checkpoint_dir="$dir/ckpt" --resume=latest 2> "$dir/err.txt"; then
  echo "resuming from a corrupted checkpoint should fail"; exit 1
fi
grep -q "model.safetensors' is corrupted: checksum" "$dir/err.txt"

# Bad flags: exit code 2 and a message naming the flag.
set +e
"$train" --preset=gpt-9000 --steps=1 2> "$dir/err2.txt"; code=$?
set -e
[[ $code == 2 ]] && grep -q "unknown gpt preset 'gpt-9000'" "$dir/err2.txt"
set +e
"$train" --preset=gpt-nano --seq_len=4096 --steps=1 2> "$dir/err3.txt"; code=$?
set -e
[[ $code == 2 ]] && grep -q "seq_len=4096 exceeds the block_size 128" "$dir/err3.txt"
# Data parallelism (threads engine): 2 ranks x batch 2 give the losses of 1
# rank x batch 4 (dropout 0), within 1e-5, for FSDP FULL_SHARD, DDP and ZeRO-1.
dp=(--preset=gpt-nano --steps=3 --seq_len=32 --dropout=0 --log_every=1)
"$train" "${dp[@]}" --batch_size=4 --metrics_out="$dir/w1.jsonl" > /dev/null
for strategy in full_shard ddp zero1; do
  "$train" "${dp[@]}" --batch_size=2 --world_size=2 --strategy=$strategy \
    --metrics_out="$dir/w2_$strategy.jsonl" > "$dir/w2_$strategy.log"
  [[ $(losses "$dir/w2_$strategy.jsonl" | wc -l) == 3 ]]
  paste -d' ' <(losses "$dir/w1.jsonl") <(losses "$dir/w2_$strategy.jsonl") |
    awk -v s=$strategy '{ d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 1e-5) {
      print s ": step " $1 " loss " $2 " vs " $4; bad = 1 } } END { exit bad }'
  grep -q "per-rank peak memory by category" "$dir/w2_$strategy.log"
done
echo "world 2 x batch 2 losses equal world 1 x batch 4 (full_shard, ddp, zero1)"
# Not supported yet under data parallelism: clear errors, exit code 2.
set +e
"$train" "${dp[@]}" --world_size=2 --checkpoint_dir="$dir/dpckpt" 2> "$dir/err4.txt"; code=$?
set -e
[[ $code == 2 ]] && grep -q "checkpoint_dir and --resume are not supported" "$dir/err4.txt"
set +e
"$train" "${dp[@]}" --world_size=2 --strategy=fsdp 2> "$dir/err5.txt"; code=$?
set -e
[[ $code == 2 ]] && grep -q "strategy='fsdp' is not one of" "$dir/err5.txt"

# bf16 mixed precision under FSDP matches one process in bf16 (gradients are
# rounded to bf16 per rank before averaging: 2e-3 relative), and DDP refuses it.
"$train" "${dp[@]}" --batch_size=4 --precision=bf16 --metrics_out="$dir/w1_bf16.jsonl" > /dev/null
"$train" "${dp[@]}" --batch_size=2 --world_size=2 --strategy=full_shard --precision=bf16 \
  --metrics_out="$dir/w2_bf16.jsonl" > /dev/null
paste -d' ' <(losses "$dir/w1_bf16.jsonl") <(losses "$dir/w2_bf16.jsonl") |
  awk '{ d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 2e-3 * $2) {
    print "bf16: step " $1 " loss " $2 " vs " $4; bad = 1 } } END { exit bad }'
set +e
"$train" "${dp[@]}" --world_size=2 --strategy=ddp --precision=bf16 2> "$dir/err6.txt"; code=$?
set -e
[[ $code == 2 ]] && grep -q "precision=bf16 with --strategy=ddp is not supported yet" "$dir/err6.txt"
echo PASS
