#!/usr/bin/env bash
# --resume continues with exactly the losses of an uninterrupted run, with
# dropout on; a corrupted checkpoint is a clear error; bad flags are errors;
# an unusable --checkpoint_dir fails before training; data parallelism and bf16.
set -euo pipefail
train="$1"
dir="${TEST_TMPDIR}/resume"
mkdir -p "$dir"
common=(--preset=gpt-nano --steps=6 --batch_size=4 --seq_len=32 --dropout=0.1 --log_every=1)

losses() { sed -E 's/.*"step":([0-9]+),"loss":([0-9.]+).*/\1 \2/' "$1"; }

"$train" "${common[@]}" --metrics_out="$dir/full.jsonl" > "$dir/full.log"
"$train" "${common[@]}" --steps=3 --checkpoint_dir="$dir/ckpt" --metrics_out="$dir/part1.jsonl" \
  > "$dir/part1.log"
grep -q "^saved checkpoint $dir/ckpt/step_000003 (.* MiB in .* s)$" "$dir/part1.log"
"$train" "${common[@]}" --checkpoint_dir="$dir/ckpt" --resume=latest \
  --metrics_out="$dir/part2.jsonl" > "$dir/resumed.log"
grep -q "resumed from .*step_000003 at step 3" "$dir/resumed.log"

diff <(losses "$dir/full.jsonl") <(cat <(losses "$dir/part1.jsonl") <(losses "$dir/part2.jsonl"))
[[ $(losses "$dir/full.jsonl" | wc -l) == 6 ]]
echo "resumed losses equal the uninterrupted run's:"
losses "$dir/full.jsonl"

# A fresh run into a folder of checkpoints is refused (its saves would replace
# them); --resume=auto resumes the latest when there is one, else starts fresh.
if "$train" "${common[@]}" --steps=2 --checkpoint_dir="$dir/ckpt" > /dev/null 2> "$dir/fresh.txt"
then echo "a fresh run into a folder of checkpoints was accepted"; exit 1; fi
grep -q "holds an earlier run's checkpoints (latest: step_000006)" "$dir/fresh.txt" ||
  { echo "expected the folder's checkpoints named:"; cat "$dir/fresh.txt"; exit 1; }
cp -r "$dir/ckpt" "$dir/ckpt_auto"  # the checks below read ckpt as it is
"$train" "${common[@]}" --steps=7 --checkpoint_dir="$dir/ckpt_auto" --resume=auto > "$dir/auto.log"
grep -q "resumed from .*ckpt_auto/step_000006 at step 6" "$dir/auto.log"
"$train" "${common[@]}" --steps=1 --checkpoint_dir="$dir/auto_fresh" --resume=auto \
  > "$dir/auto_fresh.log"
grep -q -- "--resume=auto: no checkpoint in $dir/auto_fresh yet: starting from step 0" \
  "$dir/auto_fresh.log"
[[ "$(cat "$dir/auto_fresh/latest")" == step_000001 ]]
echo "a fresh run keeps an earlier run's checkpoints; --resume=auto resumes or starts"

# A resumed run that changes an optimizer setting says so, and continues with its own.
"$train" "${common[@]}" --steps=4 --resume="$dir/ckpt/step_000003" --weight_decay=0.05 \
  > /dev/null 2> "$dir/note.txt"
grep -q "note: the checkpoint was trained with optimizer adamw(.*weight_decay=0.1); continuing with adamw(.*weight_decay=0.05)" "$dir/note.txt" ||
  { echo "expected a note naming both weight decays:"; cat "$dir/note.txt"; exit 1; }

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
# Going back to an earlier step is refused while a later step folder is there
# (this run's saves, or a later --resume=latest, would replace step_000006).
set +e
"$train" "${common[@]}" --steps=4 --checkpoint_dir="$dir/ckpt" \
  --resume="$dir/ckpt/step_000003" > /dev/null 2> "$dir/back.txt"; code=$?
set -e
[[ $code == 2 ]] && grep -qF "goes back to step 3 of --checkpoint_dir=$dir/ckpt, which holds \
later checkpoints (step_000006) that this run's saves, or a later --resume=latest, would \
replace: resume the newest (--resume=$dir/ckpt/step_000006), or move them aside first \
(mv -T $dir/ckpt/step_000006 $dir/ckpt/step_000006.before-resume)" \
  "$dir/back.txt" || { echo "going back over step 6: got $code:"; cat "$dir/back.txt"; exit 1; }
# A job restarted (RESTART_COUNT > 0 and its LAUNCH_ID, as //tools:launch sets
# them) with the --resume its first attempt started from continues its own
# latest checkpoint instead (the folder's lock names the launch), and says
# so; a restart of another launch (even of a run of the same id) is refused,
# saying what a restart wants.
LAUNCH_ID=42-7 RESTART_COUNT=0 "$train" "${common[@]}" --steps=4 \
  --checkpoint_dir="$dir/branched" --resume="$dir/ckpt/step_000003" > /dev/null
grep -q " for launch 42-7$" "$dir/branched/.lock"
LAUNCH_ID=42-7 RESTART_COUNT=1 "$train" "${common[@]}" --steps=5 \
  --checkpoint_dir="$dir/branched" --resume="$dir/ckpt/step_000003" \
  > "$dir/restart.log" 2> "$dir/restart.err"
grep -qF "train: note: restart 1 of this job: continuing $dir/branched's latest checkpoint, \
not --resume=$dir/ckpt/step_000003 (where its first attempt started)" "$dir/restart.err" ||
  { cat "$dir/restart.err"; exit 1; }
grep -q "resumed from $dir/branched/step_000004 at step 4" "$dir/restart.log"
set +e
LAUNCH_ID=43-9 RESTART_COUNT=1 "$train" "${common[@]}" --steps=6 \
  --checkpoint_dir="$dir/branched" --resume="$dir/ckpt/step_000003" \
  > /dev/null 2> "$dir/other_run.err"; code=$?
set -e
[[ $code == 2 ]] && grep -q "is a checkpoint of another folder.*--resume=auto continues" \
  "$dir/other_run.err" ||
  { echo "another launch's restart: exit $code"; cat "$dir/other_run.err"; exit 1; }
# Moved aside: resuming an earlier step of the directory points its latest
# there (it named step 6).
mv "$dir/ckpt/step_000006" "$dir/ckpt/step_000006.before-resume"
"$train" "${common[@]}" --steps=4 --checkpoint_dir="$dir/ckpt" \
  --resume="$dir/ckpt/step_000003" > "$dir/branch.log"
grep -q "ckpt/latest now names step_000003, the step this run continues (it named step_000006" \
  "$dir/branch.log" || { cat "$dir/branch.log"; exit 1; }
[[ "$(cat "$dir/ckpt/latest")" == step_000004 && -d "$dir/ckpt/step_000006.before-resume" ]]

# A step folder kept without optimizer.safetensors (the model alone) does not resume, in one
# process or under FSDP: exit 1 (the checkpoint lacks data), naming --init_from.
mkdir -p "$dir/alone" && cp -r "$dir/ckpt/step_000004" "$dir/alone/"
rm "$dir/alone/step_000004/optimizer.safetensors"
for ranks in 1 2; do
  set +e
  "$train" "${common[@]}" --batch_size=$((4 / ranks)) --world_size=$ranks --strategy=full_shard \
    --resume="$dir/alone/step_000004" > /dev/null 2> "$dir/alone.txt"; code=$?
  set -e
  [[ $code == 1 ]] && grep -q "holds the model alone .* give --init_from=$dir/alone/step_000004" \
    "$dir/alone.txt" || { echo "world $ranks: model-only resume: got $code:"; cat "$dir/alone.txt"
    exit 1; }
done

# --steps=0 from scratch trains nothing, and says so (exit 0).
"$train" "${common[@]}" --steps=0 > /dev/null 2> "$dir/zero.txt"
grep -q "^train: note: --steps=0: nothing to train" "$dir/zero.txt" || { cat "$dir/zero.txt"; exit 1; }

# Bad flags: exit code 2 and a message naming the flag.
set +e
"$train" --preset=gpt-9000 --steps=1 2> "$dir/err2.txt"; code=$?
set -e
[[ $code == 2 ]] && grep -q "unknown gpt preset 'gpt-9000'" "$dir/err2.txt" ||
  { echo "expected exit 2 and unknown gpt preset gpt-9000; got $code:"; cat "$dir/err2.txt"; exit 1; }
set +e
"$train" --preset=gpt-nano --seq_len=4096 --steps=1 2> "$dir/err3.txt"; code=$?
set -e
[[ $code == 2 ]] && grep -q "seq_len=4096 exceeds the block_size 128" "$dir/err3.txt" ||
  { echo "expected exit 2 and seq_len=4096 exceeds the block_size 128; got $code:"; cat "$dir/err3.txt"; exit 1; }
# Flag values that do not work: exit code 2 and a message naming the flag.
bad_flag() {  # bad_flag PATTERN FLAGS...
  local pattern=$1
  shift
  set +e
  "$train" --preset=gpt-nano --seq_len=32 --steps=1 "$@" > /dev/null 2> "$dir/err_flag.txt"
  local code=$?
  set -e
  [[ $code == 2 ]] && grep -q -- "$pattern" "$dir/err_flag.txt" ||
    { echo "$*: expected exit 2 and '$pattern'; got $code:"; cat "$dir/err_flag.txt"; exit 1; }
}
bad_flag "--grad_clip=-1 must be finite and >= 0" --grad_clip=-1
bad_flag "--grad_clip=inf must be finite and >= 0" --grad_clip=inf
bad_flag "--lr=0.5 with --lr_schedule='cosine:max_lr=6e-4" --lr=0.5 \
  --lr_schedule=cosine:max_lr=6e-4,min_lr=6e-5,warmup_steps=1,total_steps=9
bad_flag "--grad_clip=nan must be finite and >= 0" --grad_clip=nan
bad_flag "--resume=$dir/none: no such checkpoint folder" --resume="$dir/none"
bad_flag "--data=$dir/none.txt: .*cannot open" --data="$dir/none.txt"
# The optimizer's flags are checked before the data is read.
bad_flag "--optimizer='lion' is not one of adamw, sgd" --optimizer=lion --data="$dir/none.txt"
bad_flag "--metrics_out: cannot open '$dir/none/m.jsonl'" --metrics_out="$dir/none/m.jsonl"
bad_flag "--peak_tflops=-1 must be finite and >= 0" --peak_tflops=-1

# MFU against a given peak (the CPU has no known one): on the step lines, the
# summary and in the metrics; none without the flag.
"$train" "${common[@]}" --steps=2 --peak_tflops=0.5 --metrics_out="$dir/mfu.jsonl" > "$dir/mfu.log"
grep -Eq "^step +2 \| .* tok/s \| MFU [0-9.]+% \| peak MiB" "$dir/mfu.log"
grep -Eq "^mean .* tokens/s, MFU [0-9.]+% over 1 steps" "$dir/mfu.log"
grep -q '"mfu":0\.[0-9]*,"memory"' "$dir/mfu.jsonl"
if grep -q "MFU" "$dir/full.log"; then echo "an MFU without a known peak"; exit 1; fi
echo "bad flag values: exit 2, naming the flag"
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
# A --checkpoint_dir that cannot be created fails before the first step (one
# process and data parallel), not at the first save; missing parents are made.
touch "$dir/a_file"
for ranks in 1 2; do
  set +e
  "$train" "${dp[@]}" --world_size=$ranks --checkpoint_dir="$dir/a_file/ck" > "$dir/out4.txt" 2> "$dir/err4.txt"; code=$?
  set -e
  [[ $code == 2 ]] && grep -q -- "--checkpoint_dir: cannot create directory '$dir/a_file/ck'" "$dir/err4.txt" ||
    { echo "world $ranks: expected exit 2 naming --checkpoint_dir; got $code:"; cat "$dir/err4.txt"; exit 1; }
  ! grep -q "^step" "$dir/out4.txt" || { echo "world $ranks: trained before failing"; exit 1; }
  "$train" "${dp[@]}" --steps=1 --world_size=$ranks --checkpoint_dir="$dir/new$ranks/a/b" > /dev/null
  [[ "$(cat "$dir/new$ranks/a/b/latest")" == step_000001 ]]
done
echo "an unusable --checkpoint_dir fails before training; nested new folders are made"
# --resume=latest into a folder with no checkpoint (a mistyped --checkpoint_dir)
# fails before the model is built, and makes no folder.
for ranks in 1 2; do
  set +e
  "$train" "${dp[@]}" --world_size=$ranks --checkpoint_dir="$dir/typo$ranks" --resume=latest \
    > "$dir/out6.txt" 2> "$dir/err6.txt"; code=$?
  set -e
  [[ $code == 1 ]] && grep -q "no checkpoint to resume: '$dir/typo$ranks/latest' is missing" \
    "$dir/err6.txt" || { echo "world $ranks: --resume=latest of no checkpoint: got $code:";
    cat "$dir/err6.txt"; exit 1; }
  ! grep -q "^model" "$dir/out6.txt" || { echo "world $ranks: built the model first"; exit 1; }
  [[ ! -e "$dir/typo$ranks" ]] || { echo "world $ranks: made $dir/typo$ranks"; exit 1; }
done
set +e
"$train" "${dp[@]}" --world_size=2 --strategy=fsdp 2> "$dir/err5.txt"; code=$?
set -e
[[ $code == 2 ]] && grep -q "strategy='fsdp' is not one of" "$dir/err5.txt" ||
  { echo "expected exit 2 and strategy=fsdp is not one of; got $code:"; cat "$dir/err5.txt"; exit 1; }

# bf16 mixed precision under FSDP and DDP matches one process in bf16
# (gradients are rounded to bf16 per rank before averaging: 2e-3 relative).
"$train" "${dp[@]}" --batch_size=4 --precision=bf16 --metrics_out="$dir/w1_bf16.jsonl" > /dev/null
for strategy in full_shard ddp; do
  "$train" "${dp[@]}" --batch_size=2 --world_size=2 --strategy=$strategy --precision=bf16 \
    --metrics_out="$dir/w2_bf16_$strategy.jsonl" > "$dir/w2_bf16.log"
  # The ranks' start-up line says the precision, as one process's does.
  grep -q "^data: .* 2 ranks .* | precision param=bf16 reduce=bf16 " "$dir/w2_bf16.log"
  [[ $(losses "$dir/w2_bf16_$strategy.jsonl" | wc -l) == 3 ]]
  paste -d' ' <(losses "$dir/w1_bf16.jsonl") <(losses "$dir/w2_bf16_$strategy.jsonl") |
    awk -v s=$strategy '{ d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 2e-3 * $2) {
      print "bf16 " s ": step " $1 " loss " $2 " vs " $4; bad = 1 } } END { exit bad }'
done
echo PASS
