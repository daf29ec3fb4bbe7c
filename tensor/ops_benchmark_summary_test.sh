#!/bin/bash
# //tensor:ops_benchmark's summary tables hold only what ran: none after
# --benchmark_list_tests, only the bandwidth table for a filtered softmax run,
# and "-" where the memcpy of the same bytes was filtered out.
set -euo pipefail
bench="$1"
out="${TEST_TMPDIR}/out.txt"

"$bench" --benchmark_list_tests > "$out"
grep -q "^Softmax/fwd/causal_96x256x256/f32" "$out"
if grep -qE "GFLOP/s: ours|bandwidth \(GB/s" "$out"; then
  echo "a summary table after --benchmark_list_tests:"; tail -5 "$out"; exit 1
fi

"$bench" --benchmark_filter='^Softmax/fwd/causal_96x256x256/f32|^Memcpy/50.3MB/pool' \
  --benchmark_min_time=0.01 > "$out"
grep -qE "^Softmax/fwd/causal_96x256x256/f32 +[0-9.]+ +[0-9.]+ +[0-9.]+%$" "$out" ||
  { echo "no softmax row with its memcpy ratio:"; cat "$out"; exit 1; }
if grep -q "GFLOP/s: ours" "$out"; then
  echo "a GEMM table for a run without GEMMs:"; cat "$out"; exit 1
fi

"$bench" --benchmark_filter='^Softmax/fwd/causal_96x256x256/f32' --benchmark_min_time=0.01 > "$out"
grep -qE "^Softmax/fwd/causal_96x256x256/f32 +[0-9.]+ +- +-$" "$out" ||
  { echo "no '-' where the memcpy did not run:"; cat "$out"; exit 1; }
echo PASS
