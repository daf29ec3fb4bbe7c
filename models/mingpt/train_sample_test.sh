#!/usr/bin/env bash
# Samples during training (--sample_every, as minGPT's chargpt): every N steps
# and after the last, rank 0 prints the prompt continued by --sample_tokens
# tokens; a run repeats its samples; under FSDP FULL_SHARD (world 2, every
# unit gathered for the draw, or unit by unit with --sample_gather=unit: the
# same samples) training goes on after each sample with the losses of a run
# without samples; bad values exit 2 naming the flag.
set -euo pipefail
train="$1"
source "$2"  # models/common/cli_testing.sh: exits_2
source "$3"  # models/common/losses_testing.sh: losses, same_losses
dir="${TEST_TMPDIR}/sample"
mkdir -p "$dir"
samples() { grep -A1 "^sample at step" "$1" | grep -v "^--$"; }

common=(--preset=gpt-nano --data=shipped --steps=5 --seq_len=32 --batch_size=4 --log_every=1
        --dropout=0.1)
"$train" "${common[@]}" --sample_every=2 --sample_tokens=20 --sample_prompt="Light is" \
  > "$dir/one.log"
[[ "$(grep '^sample at step' "$dir/one.log" | tr '\n' ' ')" == \
   "sample at step 2: sample at step 4: sample at step 5: " ]]
[[ $(samples "$dir/one.log" | grep -c '^Light is') == 3 ]]
"$train" "${common[@]}" --sample_every=2 --sample_tokens=20 --sample_prompt="Light is" \
  > "$dir/again.log"
diff <(samples "$dir/one.log") <(samples "$dir/again.log")
echo "samples after steps 2, 4 and 5, the same in a second run"

# FSDP: every rank draws, rank 0 prints once; the losses are those of a run without samples.
fsdp=(--world_size=2 --strategy=full_shard --metrics_out)
"$train" "${common[@]}" "${fsdp[@]}"="$dir/plain.jsonl" > /dev/null
"$train" "${common[@]}" "${fsdp[@]}"="$dir/sampled.jsonl" --sample_every=2 --sample_tokens=20 \
  > "$dir/fsdp.log"
[[ $(grep -c '^sample at step' "$dir/fsdp.log") == 3 ]]
same_losses "$dir/plain.jsonl" "$dir/sampled.jsonl" "FSDP with samples"
echo "FSDP FULL_SHARD: samples from the gathered model, training unchanged"
# Unit by unit (each decoding step gathers and frees the blocks): the same samples.
"$train" "${common[@]}" "${fsdp[@]}"="$dir/per_unit.jsonl" --sample_every=2 --sample_tokens=20 \
  --sample_gather=unit > "$dir/per_unit.log"
diff <(samples "$dir/fsdp.log") <(samples "$dir/per_unit.log")
same_losses "$dir/plain.jsonl" "$dir/per_unit.jsonl" "FSDP with samples gathered unit by unit"
echo "FSDP FULL_SHARD, --sample_gather=unit: the same samples, training unchanged"

exits_2 "--sample_every must be >= 0 (0: no samples), got -1" "$train" --sample_every=-1
exits_2 "--sample_tokens must be >= 1, got 0" "$train" --sample_every=1 --sample_tokens=0
exits_2 "--sample_gather must be model or unit, got 'layer'" "$train" --sample_every=1 \
  --sample_gather=layer
exits_2 "--sample_prompt is empty" "$train" --sample_every=1 --sample_prompt=
exits_2 "--sample_prompt is byte-level text, and this model's vocabulary is" "$train" \
  --data=random --sample_every=1
# A sample's settings without --sample_every draw nothing: named, not ignored.
exits_2 "--sample_tokens without --sample_every: no sample is drawn" "$train" --sample_tokens=5
exits_2 "--sample_prompt without --sample_every: no sample is drawn" "$train" --sample_prompt=Hi
exits_2 "--sample_gather=unit without --sample_every" "$train" --sample_gather=unit
exits_2 "--sample_gather=unit gathers FSDP's units one by one, and DDP has none" "$train" \
  --sample_every=1 --sample_gather=unit --world_size=2 --strategy=ddp
exits_2 "and one process without --strategy has none" "$train" --sample_every=1 \
  --sample_gather=unit
echo PASS
