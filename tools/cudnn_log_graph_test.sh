#!/usr/bin/env bash
# tools/cudnn_log_graph.py on two operations of a cuDNN API log (attention_cudnn.cc's forward,
# logged on the host): printed canonically (virtual uids renamed v1, v2), the same graph with
# other virtual uids compared equal, a changed stride found, and its errors.
set -euo pipefail
script=$1 log=$2
fail() { echo "FAIL: $*" >&2; exit 1; }
out=$(python3 "$script" "$log")
echo "$out"
[[ $(head -1 <<< "$out") == OPERATION_MATMUL ]] || fail "the matmul first"
grep -q "cDesc: CUDNN_DATA_FLOAT \[2,4,256,256\] \[262144,65536,256,1\] uid=v1$" <<< "$out" ||
  fail "the virtual scores renamed v1"
grep -q "bDesc: CUDNN_DATA_FLOAT \[1,1,1,1\] \[1,1,1,1\] uid=5 byval$" <<< "$out" ||
  fail "the by-value scale keeps its uid"
grep -q "mode=CUDNN_POINTWISE_MUL (1)" <<< "$out" || fail "the pointwise mode"
# Other virtual uids: the same graph.
sed 's/val=100;/val=7;/; s/val=101;/val=9;/' "$log" > "$TEST_TMPDIR/renumbered.log"
same=$(python3 "$script" "$log" "$TEST_TMPDIR/renumbered.log") || fail "renumbered uids differ: $same"
grep -q "2 operations compared, 0 differences" <<< "$same" || fail "the comparison's count: $same"
# A stride changed: found, exit 1.
sed '0,/strideA: type=int; val=\[196608,64,768,1\]/s//strideA: type=int; val=[65536,64,256,1]/' \
  "$log" > "$TEST_TMPDIR/strided.log"
if diff_out=$(python3 "$script" "$log" "$TEST_TMPDIR/strided.log"); then fail "a changed stride passed"; fi
grep -q "< aDesc: CUDNN_DATA_BFLOAT16 \[2,4,256,64\] \[196608,64,768,1\] uid=0" <<< "$diff_out" ||
  fail "the differing line: $diff_out"
grep -q "1 differences" <<< "$diff_out" || fail "one difference: $diff_out"
# --ops takes a slice.
[[ $(python3 "$script" "$log" --ops 1:2 | head -1) == OPERATION_POINTWISE ]] || fail "--ops 1:2"
# Errors.
printf 'no cuDNN here\n' > "$TEST_TMPDIR/empty.log"
if err=$(python3 "$script" "$TEST_TMPDIR/empty.log" 2>&1); then fail "a log without operations passed"; fi
grep -q "logs no finalized operation" <<< "$err" || fail "the error names what is missing: $err"
if err=$(python3 "$script" "$log" --ops 3 2>&1); then fail "a bad --ops passed"; fi
grep -q "FIRST:END" <<< "$err" || fail "--ops error: $err"
echo PASS
