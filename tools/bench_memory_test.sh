#!/bin/bash
# //tools:bench_memory and //tools:bench_throughput at their smallest: an
# fp32 run writes its JSON; on a CPU without bf16 units their default
# precisions (fp32,bf16) stop before any run, naming --precision (a bf16
# refusal used to come after the fp32 half had run, and lose it).
set -euo pipefail
memory="$1"
throughput="$2"
dir="${TEST_TMPDIR}/bench"
mkdir -p "$dir"
unset FSDP_ALLOW_SLOW_BF16

"$memory" --presets=gpt-nano --world_sizes=2 --strategies=ddp,full_shard --precision=fp32 \
  --seq_len=16 --vocab_size=64 --json_out="$dir/memory.json" > "$dir/memory.txt"
grep -q '"rows"' "$dir/memory.json" || { echo "no rows in memory.json"; exit 1; }
echo "bench_memory fp32 writes its JSON"

rc=0
"$memory" --presets=gpt-nano --world_sizes=2 --strategies=ddp --seq_len=16 --vocab_size=64 \
  > "$dir/bf16.txt" 2> "$dir/bf16.err" || rc=$?
if [[ $rc == 2 ]]; then
  grep -q -- "--precision=fp32,bf16: bf16 is not supported on cpu" "$dir/bf16.err"
  grep -q -- "--precision=fp32 runs here" "$dir/bf16.err"
  [[ ! -s "$dir/bf16.txt" || $(grep -c "^gpt-nano" "$dir/bf16.txt" || true) == 0 ]]
  rc=0
  "$throughput" --presets=gpt-nano --seq_len=16 --vocab_size=64 > /dev/null 2> "$dir/t.err" ||
    rc=$?
  [[ $rc == 2 ]] && grep -q -- "--precision=fp32 runs here" "$dir/t.err" ||
    { echo "bench_throughput exit $rc:"; cat "$dir/t.err"; exit 1; }
  echo "without bf16 units, bf16 is refused before any run"
elif [[ $rc == 0 ]]; then
  echo "this CPU runs bf16: the refusal is not exercised"
else
  echo "bench_memory exit $rc:"; cat "$dir/bf16.err"; exit 1
fi

# Bad flags: exit 2 naming them, before anything runs (they used to fail a
# rank mid-run, or after the whole run for --json_out).
bad() {  # bad WANT COMMAND...
  local want="$1" rc=0
  shift
  "$@" > "$dir/bad.out" 2> "$dir/bad.err" || rc=$?
  [[ $rc == 2 ]] && grep -qF -- "$want" "$dir/bad.err" && [[ ! -s "$dir/bad.out" ]] ||
    { echo "exit $rc from $*, wanted 2 and '$want':"; cat "$dir/bad.err" "$dir/bad.out"; exit 1; }
}
small=(--presets=gpt-nano --precision=fp32 --seq_len=16 --vocab_size=64)
bad "--world_sizes=1: one rank has nothing to shard" "$memory" "${small[@]}" --world_sizes=1
bad "--max_inflight_buckets=-1 must be >= 0" "$memory" "${small[@]}" --max_inflight_buckets=-1
bad "--bucket_cap_mb=0 must be in (0, 1e6]" "$memory" "${small[@]}" --bucket_cap_mb=0
bad "--seq_len=1000 exceeds the block_size 128 of gpt-nano" "$memory" "${small[@]}" --seq_len=1000
bad "--json_out: cannot write '$dir/none/x.json': No such file or directory" \
  "$memory" "${small[@]}" --json_out="$dir/none/x.json"
bad "--vocab_size=0 must be in [1, 2^31]" "$memory" "${small[@]}" --vocab_size=0
bad "--seq_len=0 must be >= 1" "$memory" "${small[@]}" --seq_len=0
bad "--vocab_size=0 must be in [1, 2^31]" "$throughput" "${small[@]}" --vocab_size=0
bad "--backward_prefetch='foo' is not one of pre, post, none" \
  "$throughput" "${small[@]}" --backward_prefetch=foo
bad "--max_inflight_all_gathers=0 must be >= 1" "$throughput" "${small[@]}" \
  --max_inflight_all_gathers=0
bad "--json_out: cannot write '$dir/none/x.json'" \
  "$throughput" "${small[@]}" --json_out="$dir/none/x.json"
# A list's empty entry is refused (it used to be skipped here), as in every binary.
bad "--world_sizes='2,,4' has an empty entry (entries are comma-separated)" \
  "$memory" "${small[@]}" --world_sizes=2,,4
bad "--presets='gpt-nano,' has an empty entry" "$memory" "${small[@]}" --presets=gpt-nano,
bad "--precision=',fp32' has an empty entry" "$throughput" "${small[@]}" --precision=,fp32
bad "--presets is empty: name a preset" "$throughput" "${small[@]}" --presets=" "
echo "bad flags are refused before any run"
