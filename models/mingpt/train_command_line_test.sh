#!/bin/bash
# The binaries' command lines (models/common/command_line.h) on the real
# binaries: a mistyped flag, a value a flag cannot take, a stray argument and
# "--bool_flag false" each stop the program before it runs (exit 2, naming
# what was wrong), and --help lists the flags the train binary shares with
# the others (models/common/*_flags.cc), not only its own.
set -euo pipefail
train="$1"
sample="$2"
checkpoint="$3"
source "$4"  # models/common/cli_testing.sh: exits_2

exits_2 "train: error: unknown flag --stpes (did you mean --steps?)" "$train" --stpes=3
exits_2 "train: error: --steps=abc: Illegal value 'abc' specified for flag 'steps'" \
  "$train" --steps=abc
exits_2 "train: error: --activation_checkpointing false: a boolean flag takes its value after" \
  "$train" --activation_checkpointing false --steps=1
exits_2 "train: error: unexpected argument 'extra': this program takes flags only" \
  "$train" --steps=1 extra
exits_2 "sample: error: unexpected argument 'Light is': this program takes flags only" \
  "$sample" --checkpoint=/nonexistent "Light is"
exits_2 "checkpoint: error: unknown flag --param (did you mean --params?)" \
  "$checkpoint" info /nonexistent --param
exits_2 "checkpoint: error: unexpected argument 'c': this program takes at most 3 arguments" \
  "$checkpoint" diff a b c
exits_2 "checkpoint: error: unknown command 'inspect' (info, verify, consolidate, shard," \
  "$checkpoint" inspect /nonexistent
exits_2 "checkpoint: error: wrong number of arguments for 'consolidate'; usage:" \
  "$checkpoint" consolidate /nonexistent
exits_2 "train: error: --checkpoint_dir needs a value, and the next argument is the flag" \
  "$train" --checkpoint_dir --resume=latest
echo "mistyped command lines exit 2 naming what was wrong"

help="${TEST_TMPDIR}/help.txt"
"$train" --help > "$help" 2>&1 || true
for flag in --strategy --world_size --eval_data --freeze --loss_scale --sample_every --steps; do
  grep -qE "^ *${flag} " "$help" ||
    { echo "train --help does not list ${flag}:"; cat "$help"; exit 1; }
done
"$train" -h > "$help" 2>&1 || true
grep -qE "^ *--strategy " "$help" || { echo "train -h is not --help:"; cat "$help"; exit 1; }
echo "train --help (and -h) lists the shared flags"

# As under `bazel run`: relative paths mean the directory bazel was run from.
wd="${TEST_TMPDIR}/working_directory"
mkdir -p "$wd"
printf 'Light is a relative path in the working directory. %.0s' {1..40} > "$wd/text.txt"
train_path="$(realpath "$train")"
(cd / && BUILD_WORKING_DIRECTORY="$wd" "$train_path" --data=text.txt --steps=1 --batch_size=2 \
  --seq_len=16 --preset=gpt-nano --metrics_out=metrics.jsonl > "$wd/run.log")
[[ -s "$wd/metrics.jsonl" ]] ||
  { echo "no metrics.jsonl in BUILD_WORKING_DIRECTORY:"; cat "$wd/run.log"; exit 1; }
echo "under bazel run, relative paths are the working directory's"
