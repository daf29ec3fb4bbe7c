# Shell helpers of the binaries' command-line tests (sourced).
# exits_2 WANT COMMAND...: COMMAND exits 2 (bad input) and its stderr holds
# WANT, a fixed string; otherwise the test stops, showing what it printed.
exits_2() {
  local want="$1" err="${TEST_TMPDIR}/exits_2.stderr" rc=0
  shift
  "$@" > /dev/null 2> "$err" || rc=$?
  [[ $rc == 2 ]] || { echo "exit $rc, wanted 2: $*"; cat "$err"; exit 1; }
  grep -qF -- "$want" "$err" || { echo "wanted '$want' from $*:"; cat "$err"; exit 1; }
}
