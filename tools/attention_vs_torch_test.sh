#!/usr/bin/env bash
# tools/attention_vs_torch.py without PyTorch (--backends=): attention_benchmark's output read from
# a file and from a command (B and iters appended to it), parsed into the table and the JSON; and
# its errors (another B, an unknown backend, output without the fused lines).
set -euo pipefail
script=$1 sample=$2
fail() { echo "FAIL: $*" >&2; exit 1; }
out=$(python3 "$script" --ours_output "$sample" --backends= --json_out "$TEST_TMPDIR/a.json")
echo "$out"
grep -Eq '^ 1024 ours +0\.088 \( 146\.4\) +0\.318 \( 141\.8\) +0\.231 \( 139\.4\)' <<< "$out" ||
  fail "T 1024: the fused forward, fwd + bwd and deterministic backward with their TFLOP/s"
grep -Eq '^ 2048 ours +0\.295 ' <<< "$out" || fail "T 2048's row"
python3 - "$TEST_TMPDIR/a.json" <<'PY' || fail "json"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["batch"] == 8 and s["torch"] is None, s
assert [(r["t"], r["fwd_ms"], r["fwd_bwd_ms"], r["bwd_ms"]) for r in s["rows"]] == [
    (1024, 0.088, 0.318, 0.231), (2048, 0.295, 1.078, 0.783)], s
PY
# The command form: the sample printed by a command that is given "8 20".
out=$(python3 "$script" --ours_cmd "sh -c 'test \$1 = 8 && test \$2 = 5 && cat $sample' sh" \
  --iters 5 --backends=)
grep -Eq '^ 1024 ours +0\.088 ' <<< "$out" || fail "--ours_cmd: $out"
expect_error() {  # expect_error MESSAGE ARGS...: the script fails naming MESSAGE
  local msg=$1 err
  shift
  if err=$(python3 "$script" "$@" 2>&1); then fail "passed: $*"; fi
  grep -q -- "$msg" <<< "$err" || fail "'$*' should say '$msg', said: $err"
}
expect_error "ran at B=8, not --batch 4" --ours_output "$sample" --backends= --batch 4
expect_error "unknown backend 'foo'" --ours_output "$sample" --backends=flash,foo
printf 'nothing here\n' > "$TEST_TMPDIR/empty.txt"
expect_error "no fused forward" --ours_output "$TEST_TMPDIR/empty.txt" --backends=
expect_error "exited with 3" --ours_cmd "sh -c 'exit 3' sh" --backends=
expect_error "must be positive" --ours_output "$sample" --backends= --iters 0
echo PASS
