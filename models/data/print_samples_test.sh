#!/bin/bash
# //models/data:print_samples takes the train binaries' --data=shipped (and
# 'default') and their seed, and its errors exit 2.
set -euo pipefail
print_samples="$1"
out="${TEST_TMPDIR}/out.txt"
"$print_samples" --data=shipped --batch_size=1 --seq_len=16 > "$out"
grep -q "^source: bytes of .*newton_opticks.txt (567198 bytes)" "$out"
grep -q '^row 0 inputs:  "' "$out"
"$print_samples" --data=default --batch_size=1 --seq_len=16 | cmp - "$out"  # the same rows
"$print_samples" --data=shipped --batch_size=1 --seq_len=16 --seed=1337 | cmp - "$out"
rc=0
"$print_samples" --task=bert > /dev/null 2> "${TEST_TMPDIR}/err.txt" || rc=$?
[[ $rc == 2 ]] && grep -q "error: --task must be lm or t5, got bert" "${TEST_TMPDIR}/err.txt" ||
  { echo "exit $rc:"; cat "${TEST_TMPDIR}/err.txt"; exit 1; }
echo PASS
