#!/usr/bin/env bash
# T5's samples during training (--sample_every): every N steps and after the
# last, rank 0 prints the model's greedy fill-in of one fixed span-corrupted
# example under its inputs and targets (text for byte data, ids otherwise); a
# run repeats its samples; under FSDP FULL_SHARD (world 2) the units gathered
# whole or unit by unit (--sample_gather) give the same samples and training
# goes on with the losses of a run without samples; the start-up lines show
# the sampled example, on a resumed run too; bad values exit 2.
set -euo pipefail
train="$1"
source "$2"  # models/common/cli_testing.sh: exits_2
source "$3"  # models/common/losses_testing.sh: same_losses
dir="${TEST_TMPDIR}/t5_sample"
mkdir -p "$dir"
samples() { grep -A3 "^sample at step" "$1" | grep -v "^--$"; }

common=(--steps=5 --batch_size=4 --encoder_length=32 --log_every=1)
"$train" "${common[@]}" --sample_every=2 > "$dir/one.log"
[[ "$(grep '^sample at step' "$dir/one.log" | tr '\n' ' ')" == \
   "sample at step 2: sample at step 4: sample at step 5: " ]]
[[ $(samples "$dir/one.log" | grep -c '^  inputs:  .*<extra_id_0>') == 3 ]]
[[ $(samples "$dir/one.log" | grep -c '^  targets: <extra_id_0>') == 3 ]]
[[ $(samples "$dir/one.log" | grep -c '^  model:   ') == 3 ]]
"$train" "${common[@]}" --sample_every=2 > "$dir/again.log"
diff <(samples "$dir/one.log") <(samples "$dir/again.log")
echo "byte text: samples after steps 2, 4 and 5 as text, the same in a second run"

# The example filled in is the one the start-up lines show, on a resumed run too.
startup_inputs() { grep '^sample inputs: ' "$1" | sed 's/^sample inputs: *//'; }
sample_inputs() { samples "$1" | grep '^  inputs: ' | head -1 | sed 's/^  inputs: *//'; }
[[ -n "$(startup_inputs "$dir/one.log")" ]]
[[ "$(startup_inputs "$dir/one.log")" == "$(sample_inputs "$dir/one.log")" ]]
"$train" "${common[@]}" --steps=2 --checkpoint_dir="$dir/ckpt" > /dev/null
"$train" "${common[@]}" --checkpoint_dir="$dir/ckpt" --resume=latest --sample_every=2 \
  > "$dir/resumed.log"
grep -q "resumed from .*step_000002 at step 2" "$dir/resumed.log"
[[ "$(startup_inputs "$dir/resumed.log")" == "$(sample_inputs "$dir/one.log")" ]]
[[ "$(startup_inputs "$dir/resumed.log")" == "$(sample_inputs "$dir/resumed.log")" ]]
diff <(samples "$dir/one.log" | tail -8) <(samples "$dir/resumed.log")
echo "resumed: the start-up lines show the sampled example; the samples of an uninterrupted run"

"$train" "${common[@]}" --data=random --vocab_size=50 --sample_every=5 > "$dir/ids.log"
samples "$dir/ids.log" | grep -q '^  targets: <extra_id_0> [0-9]'
echo "random ids: the sample as ids"

fsdp=(--world_size=2 --strategy=full_shard --metrics_out)
"$train" "${common[@]}" "${fsdp[@]}"="$dir/plain.jsonl" > /dev/null
for gather in model unit; do
  "$train" "${common[@]}" "${fsdp[@]}"="$dir/$gather.jsonl" --sample_every=2 \
    --sample_gather=$gather > "$dir/$gather.log"
  [[ $(grep -c '^sample at step' "$dir/$gather.log") == 3 ]]
  same_losses "$dir/plain.jsonl" "$dir/$gather.jsonl" "FSDP with samples ($gather)"
done
diff <(samples "$dir/model.log") <(samples "$dir/unit.log")
echo "FSDP FULL_SHARD: the same samples gathered whole or unit by unit, training unchanged"

exits_2 "--sample_every must be >= 0 (0: no samples), got -1" "$train" --sample_every=-1
exits_2 "--sample_gather must be model or unit, got 'all'" "$train" --sample_every=1 \
  --sample_gather=all
echo PASS
