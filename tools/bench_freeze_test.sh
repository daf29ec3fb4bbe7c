#!/bin/bash
# //tools:bench_freeze's default variants follow the preset: the embeddings,
# then the embeddings and the lower half of its blocks (gpt-nano: block 0 of
# 3), then the whole transformer.
set -euo pipefail
bench="$1"
out="${TEST_TMPDIR}/freeze.txt"
"$bench" --preset=gpt-nano --steps=1 --warmup=0 --batch_size=2 --seq_len=16 > "$out"
grep -q "^none " "$out"
grep -q "^transformer.wte,transformer.wpe,transformer.h.0 " "$out"
if grep -q "transformer.h.1" "$out"; then
  echo "more than the lower half frozen:"; cat "$out"; exit 1
fi
grep -q "^transformer " "$out"
# Bad flags: exit 2 naming the flag, or the empty set.
bad() {  # bad WANT FLAGS...
  local want="$1" rc=0
  shift
  "$bench" --preset=gpt-nano --steps=1 --warmup=0 "$@" > /dev/null 2> "${TEST_TMPDIR}/bad.err" ||
    rc=$?
  [[ $rc == 2 ]] && grep -qF -- "$want" "${TEST_TMPDIR}/bad.err" ||
    { echo "exit $rc from $*, wanted 2 and '$want':"; cat "${TEST_TMPDIR}/bad.err"; exit 1; }
}
bad "--seq_len=0 must be >= 1" --seq_len=0
bad "--warmup=-1 must be >= 0" --warmup=-1
bad "--seq_len=1000 exceeds the block_size 128 of gpt-nano" --seq_len=1000
bad "--freeze_sets='none||transformer' has an empty set" --freeze_sets='none||transformer'
echo PASS
