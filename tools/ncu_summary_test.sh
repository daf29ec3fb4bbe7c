#!/usr/bin/env bash
# tools/ncu_summary.py on a sample of ncu's CSV (program output around the table, a units row,
# template instances of one kernel, thousands separators), and its errors.
set -euo pipefail
script=$1 sample=$2
fail() { echo "FAIL: $*" >&2; exit 1; }
out=$(python3 "$script" "$sample" --json_out "$TEST_TMPDIR/summary.json")
echo "$out"
grep -q "4 kernel launches, 3.000 ms of GPU time" <<< "$out" || fail "totals"
grep -Eq "^ *66\.7% +2\.000 +2  tensor::cuda::\(anonymous namespace\)::GemmKernel$" <<< "$out" ||
  fail "the two GemmKernel instances add up to 2 ms, 66.7%"
[[ $(sed -n 3p <<< "$out") == *GemmKernel ]] || fail "the heaviest kernel first"
grep -q "FlashForward" <<< "$out" || fail "FlashForward listed"
python3 - "$TEST_TMPDIR/summary.json" <<'PY' || fail "json"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["launches"] == 4 and abs(s["total_ms"] - 3.0) < 1e-9, s
assert [k["kernel"] for k in s["kernels"]][1:] == ["FlashForward", "LayerNormForward"], s
PY
printf 'no table here\n' > "$TEST_TMPDIR/bad.csv"
if err=$(python3 "$script" "$TEST_TMPDIR/bad.csv" 2>&1); then fail "a file without a table passed"; fi
grep -q 'no ncu CSV table' <<< "$err" || fail "the error names what is missing: $err"
echo PASS
