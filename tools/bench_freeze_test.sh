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
echo PASS
