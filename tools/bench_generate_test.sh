#!/usr/bin/env bash
# //tools:bench_generate runs both of its comparisons end to end on a tiny
# preset (gpt-nano, 3 new tokens): one process with and without the cache
# (sampled rows, and beams of gpt-nano and t5-small),
# and FSDP FULL_SHARD on 2 ranks with the model gathered whole and unit by
# unit; both ways draw the same tokens, --json_out holds the rows, and bad
# flags exit 2 naming the flag. (Speed figures are the benchmark's, not
# checked here.)
set -euo pipefail
bench="$1"
source "$2"  # models/common/cli_testing.sh: exits_2
dir="${TEST_TMPDIR}/bench_generate"
mkdir -p "$dir"
small=(--presets=gpt-nano --max_new_tokens=3 --reps=1)

"$bench" "${small[@]}" --json_out="$dir/one.json" > "$dir/one.log"
grep -q '"preset":"gpt-nano"' "$dir/one.json"
grep -q '"same_tokens":true' "$dir/one.json"
grep -q '"cached_tokens_per_s":' "$dir/one.json"
echo "one process: cached and uncached draw the same tokens"

"$bench" "${small[@]}" --presets=gpt-nano,t5-small --num_beams=3 --json_out="$dir/beams.json" \
  > "$dir/beams.log"
grep -q "3 beams per row" "$dir/beams.log"
[[ $(grep -o '"num_beams":3' "$dir/beams.json" | wc -l) == 2 ]]
[[ $(grep -o '"same_tokens":true' "$dir/beams.json" | wc -l) == 2 ]]
echo "beam search: cached (rows reordered) and uncached give the same tokens"

"$bench" "${small[@]}" --fsdp_world_size=2 --json_out="$dir/fsdp.json" > "$dir/fsdp.log"
grep -q '"fsdp_world_size":2' "$dir/fsdp.json"
grep -q '"same_tokens":true' "$dir/fsdp.json"
grep -q '"unit_param_peak_bytes":[1-9]' "$dir/fsdp.json"
echo "FSDP: whole model and unit by unit draw the same tokens"

exits_2 "--fsdp_world_size must be >= 0 (0: one process), got -1" "$bench" --fsdp_world_size=-1
exits_2 "--presets: 'gpt-huge' is neither a minGPT preset" "$bench" --presets=gpt-huge
exits_2 "--presets=',gpt-nano' has an empty entry" "$bench" --presets=,gpt-nano
exits_2 "--presets is empty: name a preset" "$bench" --presets=
exits_2 "--num_beams must be >= 1" "$bench" --num_beams=0
echo PASS
