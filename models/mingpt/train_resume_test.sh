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
echo PASS
