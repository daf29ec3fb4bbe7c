#!/usr/bin/env bash
# tools/launch_callers.py on a saved gdb output (six launches of StridedCopyKernel in a t5-small
# step under the CUDA emulation): the call chains with their counts, the emulation's and the
# module plumbing's frames dropped, parameter lists cut (names with "(anonymous namespace)" and
# template arguments kept whole), --depth, and its errors.
set -euo pipefail
script=$1 log=$2
fail() { echo "FAIL: $*" >&2; exit 1; }
out=$(python3 "$script" StridedCopyKernel --gdb_log "$log" --depth 6)
echo "$out"
[[ $(head -1 <<< "$out") == "StridedCopyKernel: 6 launches from 3 call chains (innermost first)" ]] ||
  fail "the summary line"
grep -qx "       3  tensor::cuda::CopyStridedOnDevice < tensor::Tensor::CopyFrom < tensor::Tensor::To < nn::AttentionBackward < nn::T5Attention::Backward < t5::T5LayerAttention::Backward" <<< "$out" ||
  fail "the most frequent chain first, without nn::Module's frames"
grep -q "^       1  .* < t5::(anonymous namespace)::Accumulate < t5::T5Stack::Backward" <<< "$out" ||
  fail "a name in an anonymous namespace kept whole"
grep -q "cuda_emu::\|std::function\|InvokeObject" <<< "$out" && fail "the emulation's frames dropped"
# --depth 3: the chains that differ only further out merge.
short=$(python3 "$script" StridedCopyKernel --gdb_log "$log" --depth 3)
grep -qx "       4  tensor::cuda::CopyStridedOnDevice < tensor::Tensor::CopyFrom < tensor::Tensor::To" <<< "$short" ||
  fail "--depth 3: $short"
# Errors.
printf 'Breakpoint 1 at 0x1\n' > "$TEST_TMPDIR/none.log"
if err=$(python3 "$script" StridedCopyKernel --gdb_log "$TEST_TMPDIR/none.log" 2>&1); then
  fail "a log without launches passed"
fi
grep -q "no launch of StridedCopyKernel" <<< "$err" || fail "the error names the kernel: $err"
if err=$(python3 "$script" StridedCopyKernel --gdb_log "$log" --depth 0 2>&1); then
  fail "--depth 0 passed"
fi
grep -q "at least 1" <<< "$err" || fail "--depth error: $err"
if err=$(python3 "$script" StridedCopyKernel 2>&1 < /dev/null); then fail "no binary passed"; fi
grep -q "after --\|gdb is not installed" <<< "$err" || fail "no binary: $err"
echo PASS
