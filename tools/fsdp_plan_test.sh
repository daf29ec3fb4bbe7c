#!/usr/bin/env bash
# //tools:fsdp_plan --freeze: the trainable count, the frozen units (T5's
# shared embedding kept in the root unit), less model state than with
# everything training, and a pattern that selects nothing exits 2.
set -euo pipefail
plan="$1"
source "$2"  # models/common/cli_testing.sh: exits_2
state() { awk '$1 == 8 { print $4 }' "$1"; }  # state GiB at world 8
"$plan" --preset=gpt2 --world_sizes=8 > "${TEST_TMPDIR}/all.txt"
"$plan" --preset=gpt2 --world_sizes=8 --freeze=transformer.wte,transformer.h.0 --units \
  > "${TEST_TMPDIR}/frozen.txt"
grep -q "parameters: 163037184, 117351936 trainable" "${TEST_TMPDIR}/frozen.txt" ||
  { cat "${TEST_TMPDIR}/frozen.txt"; exit 1; }
grep -qE "^ +transformer\.wte .*per rank \(frozen\)$" "${TEST_TMPDIR}/frozen.txt"
grep -qE "^ +transformer\.h\.0 .*per rank \(frozen\)$" "${TEST_TMPDIR}/frozen.txt"
[[ $(grep -c "(frozen)" "${TEST_TMPDIR}/frozen.txt") == 2 ]]
awk -v a="$(state "${TEST_TMPDIR}/frozen.txt")" -v b="$(state "${TEST_TMPDIR}/all.txt")" \
  'BEGIN { exit !(a < b) }' || { echo "state $(state "${TEST_TMPDIR}/frozen.txt") vs $(state "${TEST_TMPDIR}/all.txt")"; exit 1; }
"$plan" --preset=t5-small --world_sizes=8 --freeze=shared,encoder --units > "${TEST_TMPDIR}/t5.txt"
grep -qE "^ +<root> +2 params" "${TEST_TMPDIR}/t5.txt" || { cat "${TEST_TMPDIR}/t5.txt"; exit 1; }
exits_2 "--freeze: freeze pattern 'nope' selects no parameter" "$plan" --preset=gpt-nano --freeze=nope
echo "fsdp_plan --freeze: frozen units, less state, errors named"
