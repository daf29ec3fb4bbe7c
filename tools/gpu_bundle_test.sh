#!/usr/bin/env bash
# Test of the GPU bundle's packing and running half (tools/gpu_bundle_collect.sh and the
# run.sh it installs, tools/gpu_bundle_run.sh), without Bazel and without a GPU.
#   gpu_bundle_test.sh cpu  COLLECT RUN_SH CC_BINARY CC_TEST SESSION_SH
#                                                              (//tools:gpu_bundle_test, in //...)
#   gpu_bundle_test.sh cuda COLLECT RUN_SH CUDA_TEST...        (//tools:gpu_bundle_cuda_test,
#                                                               manual, needs --config=cuda)
# cpu: bundles a cc_binary (project libraries static) and a cc_test (project libraries from
# _solib_k8), unpacks the .tar.xz elsewhere, runs both through run.sh under `env -i` and checks
# their output and that every object they load comes from the bundle, and with
# GPU_BUNDLE_LOADER=host that glibc comes from the host and the rest from the bundle; then checks run.sh's
# messages for missing CUDA libraries with made-up needs, and tools/gpu_session.sh's tests
# phase over the bundle.
# cuda: bundles CUDA tests; checks no CUDA library went in, each needs libcudart + libcuda.so.1,
# and run.sh stops with a message naming the missing driver (or, on a machine with one, runs).
set -euo pipefail

fail() { echo "FAIL: $*" >&2; exit 1; }
expect_in() {  # expect_in NEEDLE HAYSTACK WHAT
  [[ "$2" == *"$1"* ]] || { printf '%s\n' "$2" >&2; fail "$3: expected to find '$1'"; }
}

mode=$1 collect=$2 run_sh=$3; shift 3
[[ -x "$collect" && -f "$run_sh" ]] || fail "usage: $0 cpu|cuda COLLECT RUN_SH BINARY..."
tmp=${TEST_TMPDIR:-$(mktemp -d)}
work=$tmp/gpu_bundle_test
rm -rf "$work"; mkdir -p "$work/made" "$work/unpacked" "$work/empty"

if [[ "$mode" == cpu ]]; then
  (( $# == 3 )) || fail "cpu mode takes CC_BINARY CC_TEST SESSION_SH"
  cc_binary=$1 cc_test=$2 session_sh=$(cd "$(dirname "$3")" && pwd)/$(basename "$3")
  bin_name=$(basename "$cc_binary") test_name=$(basename "$cc_test")

  GPU_BUNDLE_RUN_SH=$run_sh "$collect" "$work/made/gpu_bundle" "$cc_binary" "$cc_test" \
    > "$work/collect.log" 2>&1 || { cat "$work/collect.log" >&2; fail "collect failed"; }
  cat "$work/collect.log"
  b=$work/made/gpu_bundle
  for f in run.sh MANIFEST lib/ld-linux-x86-64.so.2 lib/libc.so.6 lib/libstdc++.so.6 \
           lib/libgcc_s.so.1 lib/libm.so.6 lib/libpthread.so.0 "bin/$bin_name" "bin/$test_name" \
           "bin/$bin_name.ldd" "bin/$bin_name.cuda-libs" "wrap/$bin_name"; do
    [[ -e "$b/$f" ]] || fail "the bundle lacks $f"
  done
  compgen -G "$b/lib/libabsl_*.so.*" >/dev/null || fail "no Abseil in lib/"
  # The cc_test's project libraries (_solib_k8) are bundled.
  solibs=$(ldd "$cc_test" | awk '/_solib_/ { print $1 }')
  [[ -n "$solibs" ]] || fail "$cc_test links no project shared object: pick a cc_test that does"
  for so in $solibs; do [[ -f "$b/lib/$so" ]] || fail "project library $so not bundled"; done
  [[ ! -s "$b/bin/$bin_name.cuda-libs" ]] || fail "a CPU binary needs CUDA libraries?"
  [[ -f "$work/made/gpu_bundle.tar.xz" ]] || fail "no gpu_bundle.tar.xz"

  # Unpack elsewhere and remove the original: nothing may point back at it.
  tar -C "$work/unpacked" -xJf "$work/made/gpu_bundle.tar.xz"
  rm -rf "$work/made"
  u=$work/unpacked/gpu_bundle

  # A clean environment: no PATH, no LD_LIBRARY_PATH; only what run.sh adds.
  out=$(cd "$work" && env -i "$u/run.sh" "$u/bin/$bin_name" 2>&1) || { echo "$out" >&2; fail "$bin_name through run.sh"; }
  expect_in "gpt-mini" "$out" "$bin_name's table"
  expect_in "21992832" "$out" "$bin_name's gpt-mini parameter count"
  out=$(env -i "$u/run.sh" "$bin_name" --json 2>&1) || { echo "$out" >&2; fail "$bin_name --json (by bare name)"; }
  expect_in '"preset"' "$out" "$bin_name --json"
  out=$(env -i "$u/wrap/$bin_name" --json 2>&1) || { echo "$out" >&2; fail "wrap/$bin_name"; }
  expect_in '"preset"' "$out" "wrap/$bin_name"
  out=$(env -i "$u/run.sh" "$u/bin/$test_name" 2>&1) || { echo "$out" >&2; fail "$test_name through run.sh"; }
  expect_in "[  PASSED  ]" "$out" "$test_name"

  # Every object the programs load comes from the bundle (the loader prints them with
  # LD_DEBUG=files; run.sh's own tools are left out by starting at the binary's first line).
  for name in "$bin_name" "$test_name"; do
    loaded=$(env -i LD_DEBUG=files "$u/run.sh" "$name" 2>&1 >/dev/null |
      awk -v b="$u/bin/$name" 'index($0, b) { on = 1 } on && /calling init:/ { print $NF }' | sort -u)
    [[ -n "$loaded" ]] || fail "LD_DEBUG=files showed nothing for $name"
    outside=$(grep -v "^$u/lib/" <<< "$loaded" || true)
    [[ -z "$outside" ]] || fail "$name loaded objects from outside the bundle: $outside"
    echo "ok: $name loads $(wc -l <<< "$loaded") objects, all from the bundle"
  done

  # The host's glibc (GPU_BUNDLE_LOADER=host, what auto picks where the host's is newer, as on
  # the GPU machine, whose NCCL needs it): the project's libraries still come from the bundle,
  # glibc from the host.
  out=$(env -i GPU_BUNDLE_LOADER=host "$u/run.sh" "$test_name" 2>&1) ||
    { echo "$out" >&2; fail "$test_name with the host's glibc"; }
  expect_in "[  PASSED  ]" "$out" "$test_name with the host's glibc"
  loaded=$(env -i GPU_BUNDLE_LOADER=host LD_DEBUG=files "$u/run.sh" "$test_name" 2>&1 >/dev/null |
    awk -v b="$u/bin/$test_name" 'index($0, b) { on = 1 } on && /calling init:/ { print $NF }' | sort -u)
  libc=$(grep '/libc\.so\.6$' <<< "$loaded" || true)
  [[ -n "$libc" && "$libc" != "$u/lib/"* ]] || fail "GPU_BUNDLE_LOADER=host loaded libc from '$libc'"
  for so in $solibs; do
    grep -q "/$so\$" <<< "$loaded" || fail "GPU_BUNDLE_LOADER=host did not load the bundled $so"
  done
  echo "ok: GPU_BUNDLE_LOADER=host: $libc, the project's libraries from the bundle"
  out=$(env -i GPU_BUNDLE_LOADER=newest "$u/run.sh" "$bin_name" 2>&1) && fail "GPU_BUNDLE_LOADER=newest ran"
  expect_in "GPU_BUNDLE_LOADER must be auto, bundled or host, not 'newest'" "$out" "a bad GPU_BUNDLE_LOADER"

  # run.sh's messages.
  out=$(env -i "$u/run.sh" no_such_binary 2>&1) && fail "an unknown binary ran"
  expect_in "no binary 'no_such_binary'" "$out" "unknown binary"
  expect_in "$bin_name" "$out" "unknown binary lists the bundled ones"

  printf 'libcuda.so.1\nlibcudart.so.13\nlibnccl.so.2\n' > "$u/bin/$bin_name.cuda-libs"
  rc=0; out=$(env -i GPU_BUNDLE_CUDA_DIRS="$work/empty" "$u/run.sh" "$bin_name" 2>&1) || rc=$?
  (( rc == 127 )) || { echo "$out" >&2; fail "missing CUDA libraries: status $rc, want 127"; }
  expect_in "lacks: libcudart.so.13 libnccl.so.2" "$out" "missing CUDA libraries"
  expect_in "$work/empty" "$out" "the folders looked in"
  expect_in "libcuda.so.1" "$out" "the missing driver"

  mkdir -p "$work/fakecuda" "$work/fakedriver"
  touch "$work/fakecuda/libcudart.so.13" "$work/fakecuda/libnccl.so.2" "$work/fakedriver/libcuda.so.1"
  rc=0; out=$(env -i GPU_BUNDLE_CUDA_DIRS="$work/fakecuda" "$u/run.sh" "$bin_name" 2>&1) || rc=$?
  (( rc == 127 )) || { echo "$out" >&2; fail "missing driver: status $rc, want 127"; }
  expect_in "no CUDA driver library (libcuda.so.1) found" "$out" "missing driver"
  out=$(env -i GPU_BUNDLE_CUDA_DIRS="$work/fakecuda" GPU_BUNDLE_ALLOW_NO_DRIVER=1 "$u/run.sh" "$bin_name" 2>&1) ||
    { echo "$out" >&2; fail "GPU_BUNDLE_ALLOW_NO_DRIVER=1 did not run"; }
  expect_in "gpt-mini" "$out" "GPU_BUNDLE_ALLOW_NO_DRIVER=1"
  out=$(env -i GPU_BUNDLE_VERBOSE=1 GPU_BUNDLE_CUDA_DIRS="$work/fakedriver:$work/fakecuda" "$u/run.sh" "$bin_name" 2>&1) ||
    { echo "$out" >&2; fail "with every CUDA library found"; }
  expect_in "library path: $u/lib:$work/fakedriver:$work/fakecuda" "$out" "the library path"
  expect_in "gpt-mini" "$out" "with every CUDA library found"

  # The session script's tests phase: every bundled *_test, a summary and the log under $OUT.
  out=$(cd "$work" && env -i PATH=/usr/bin:/bin GPU_SESSION_BUNDLE="$u" OUT="$work/session" \
    bash "$session_sh" tests 2>&1) || { echo "$out" >&2; fail "gpu_session.sh tests"; }
  expect_in "PASS $test_name (exit 0" "$out" "gpu_session.sh tests"
  expect_in "failed binaries: 0" "$(cat "$work/session/tests.txt")" "tests.txt"
  expect_in "[  PASSED  ]" "$(cat "$work/session/tests.log")" "tests.log"
  # By name; an unknown name; the deadline (none starts after it: listed as NOT RUN).
  out=$(cd "$work" && env -i PATH=/usr/bin:/bin GPU_SESSION_BUNDLE="$u" OUT="$work/session2" \
    bash "$session_sh" tests "$test_name" 2>&1) || { echo "$out" >&2; fail "gpu_session.sh tests $test_name"; }
  expect_in "PASS $test_name (exit 0" "$out" "gpu_session.sh tests by name"
  out=$(cd "$work" && env -i PATH=/usr/bin:/bin GPU_SESSION_BUNDLE="$u" OUT="$work/session2" \
    bash "$session_sh" tests no_such_test 2>&1) && fail "gpu_session.sh ran an unknown test"
  expect_in "no_such_test is not in the bundle" "$out" "gpu_session.sh tests with an unknown name"
  out=$(cd "$work" && env -i PATH=/usr/bin:/bin GPU_SESSION_BUNDLE="$u" OUT="$work/session2" \
    GPU_SESSION_DEADLINE_S=0 bash "$session_sh" tests 2>&1) || { echo "$out" >&2; fail "gpu_session.sh tests past its deadline"; }
  expect_in "NOT RUN (the phase's deadline passed): $test_name" "$out" "gpu_session.sh deadline"
  [[ "$out" != *"PASS $test_name"* ]] || fail "a test started after the deadline"
  # The cudnn phase names the binary it lacks (this bundle holds none of its four).
  out=$(cd "$work" && env -i PATH=/usr/bin:/bin GPU_SESSION_BUNDLE="$u" OUT="$work/session2" \
    bash "$session_sh" cudnn 2>&1) && fail "gpu_session.sh cudnn ran without its binaries"
  expect_in "attention_cudnn_test is not in the bundle" "$out" "gpu_session.sh cudnn without attention_cudnn_test"
  # The racecheck phase with a stand-in compute-sanitizer (runs the program; with FAKE_HAZARD
  # set, reports a hazard and exits with --error-exitcode), on this bundle's test.
  mkdir -p "$work/fakecs"
  cat > "$work/fakecs/compute-sanitizer" <<'SH'
#!/bin/bash
tool=""; code=0
while [[ "$1" == --* ]]; do
  case "$1" in --tool) tool=$2; shift 2 ;; --error-exitcode) code=$2; shift 2 ;; *) shift 2 ;; esac
done
"$@"
rc=$?
if [[ -n "${FAKE_HAZARD:-}" ]]; then
  echo "========= Error: Race reported between Write access at Kernel+0x10 and Read access"
  echo "========= ${tool^^} SUMMARY: 1 hazard displayed (1 error, 0 warnings)"
  exit "$code"
fi
echo "========= ${tool^^} SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"
exit $rc
SH
  chmod +x "$work/fakecs/compute-sanitizer"
  checks="racecheck $test_name *
synccheck $test_name *
racecheck attention_test *"
  out=$(cd "$work" && env -i PATH="$work/fakecs:/usr/bin:/bin" GPU_SESSION_BUNDLE="$u" \
    OUT="$work/session3" GPU_SESSION_RACECHECKS="$checks" bash "$session_sh" racecheck 2>&1) ||
    { echo "$out" >&2; fail "gpu_session.sh racecheck"; }
  expect_in "PASS racecheck $test_name (exit 0" "$out" "racecheck"
  expect_in "0 reports; ========= RACECHECK SUMMARY: 0 hazards" "$out" "racecheck summary"
  expect_in "PASS synccheck $test_name (exit 0" "$out" "synccheck"
  expect_in "SKIP racecheck attention_test (not in the bundle)" "$out" "racecheck skip"
  expect_in "failed checks: 0" "$(cat "$work/session3/racecheck.txt")" "racecheck.txt"
  out=$(cd "$work" && env -i PATH="$work/fakecs:/usr/bin:/bin" GPU_SESSION_BUNDLE="$u" FAKE_HAZARD=1 \
    OUT="$work/session3" GPU_SESSION_RACECHECKS="racecheck $test_name *" bash "$session_sh" racecheck 2>&1) ||
    { echo "$out" >&2; fail "gpu_session.sh racecheck with a hazard"; }
  expect_in "FAIL racecheck $test_name (exit 3" "$out" "a hazard fails"
  expect_in "1 reports" "$out" "the hazard counted"
  expect_in "Race reported between Write access" "$(cat "$work/session3/racecheck.txt")" "the hazard's lines"
  expect_in "failed checks: 1" "$out" "racecheck failures"
  out=$(cd "$work" && env -i PATH="$work/fakecs:/usr/bin:/bin" GPU_SESSION_BUNDLE="$u" OUT="$work/session3" \
    GPU_SESSION_DEADLINE_S=0 GPU_SESSION_RACECHECKS="racecheck $test_name *" bash "$session_sh" racecheck 2>&1) ||
    { echo "$out" >&2; fail "gpu_session.sh racecheck past its deadline"; }
  expect_in "NOT RUN racecheck $test_name (the phase's deadline passed)" "$out" "racecheck deadline"
  # The first phase: its tests (those in the bundle), then the benchmarks it has binaries for,
  # each only while the phase is young enough (a stand-in train: past its start time here).
  out=$(cd "$work" && env -i PATH=/usr/bin:/bin GPU_SESSION_BUNDLE="$u" OUT="$work/session4" \
    GPU_SESSION_FIRST_TESTS="no_such_test $test_name" bash "$session_sh" first 2>&1) ||
    { echo "$out" >&2; fail "gpu_session.sh first"; }
  expect_in "SKIP no_such_test (not in the bundle)" "$out" "first: a test not bundled"
  expect_in "PASS $test_name (exit 0" "$out" "first: its test"
  expect_in "failed binaries: 0" "$(cat "$work/session4/tests.txt")" "first: tests.txt"
  expect_in "SKIP pytorch (train is not in the bundle)" "$out" "first: no train"
  expect_in "SKIP bench (matmul_benchmark is not in the bundle)" "$out" "first: no benchmark"
  expect_in "SKIP profile (needs train in the bundle and ncu on this machine)" "$out" "first: no profile"
  # Without GPU_SESSION_FIRST_TESTS: every bundled test.
  out=$(cd "$work" && env -i PATH=/usr/bin:/bin GPU_SESSION_BUNDLE="$u" OUT="$work/session5" \
    bash "$session_sh" first 2>&1) || { echo "$out" >&2; fail "gpu_session.sh first, every test"; }
  expect_in "PASS $test_name (exit 0" "$out" "first: every bundled test"
  cp "$u/bin/$bin_name" "$u/bin/train"
  out=$(cd "$work" && env -i PATH=/usr/bin:/bin GPU_SESSION_BUNDLE="$u" OUT="$work/session4" \
    GPU_SESSION_FIRST_TESTS="$test_name" GPU_SESSION_PYTORCH_BY_S=0 GPU_SESSION_DEADLINE_S=0 \
    bash "$session_sh" first 2>&1) || { echo "$out" >&2; fail "gpu_session.sh first, late"; }
  expect_in "NOT RUN (the phase's deadline passed): $test_name" "$out" "first: tests past the deadline"
  expect_in "NOT RUN pytorch (the phase is " "$out" "first: pytorch too late"
  # The profile phase with a stand-in ncu: it must be given the program itself (run.sh's
  # GPU_BUNDLE_PRINT_COMMAND: env, the bundled loader, the binary) and follow its processes
  # (--target-processes all: it counts the exec'd loader as a child); it runs
  # it and prints a CSV table of two kernels, which the summary ranks. The printed command
  # itself runs the binary.
  mkdir -p "$work/fakencu"
  cat > "$work/fakencu/ncu" <<'SH'
#!/bin/bash
all=0
while [[ "$1" == --* ]]; do
  [[ "$1 $2" == "--target-processes all" ]] && all=1
  if [[ "$1" == --csv ]]; then shift; else shift 2; fi  # --csv alone takes no value
done
[[ $all == 1 && "$1" == env && "$2" == */ld-linux-x86-64.so.2 ]] ||
  { echo "fake ncu: got $*" >&2; exit 9; }
"$@" > /dev/null 2>&1  # the stand-in train (model_sizes) refuses train's flags
echo '"ID","Kernel Name","gpu__time_duration.sum"'
echo '"","","usecond"'
echo '"0","void small_kernel<float>(float *)","10"'
echo '"1","void (anonymous namespace)::big_kernel(int)","30"'
echo '"2","void small_kernel<float>(float *)","10"'
SH
  chmod +x "$work/fakencu/ncu"
  out=$(env -i GPU_BUNDLE_PRINT_COMMAND=1 "$u/run.sh" train --json 2>&1) ||
    { echo "$out" >&2; fail "GPU_BUNDLE_PRINT_COMMAND"; }
  expect_in "$u/lib/ld-linux-x86-64.so.2" "$out" "the printed command's loader"
  [[ "$(head -1 <<< "$out")" == env && "$(tail -1 <<< "$out")" == --json ]] ||
    { echo "$out" >&2; fail "the printed command: env first, the arguments last"; }
  mapfile -t cmd <<< "$out"
  out=$(env -i "${cmd[@]}" 2>&1) || { echo "$out" >&2; fail "the printed command did not run"; }
  expect_in '"preset"' "$out" "the printed command's output"
  out=$(cd "$work" && env -i PATH="$work/fakencu:/usr/bin:/bin" GPU_SESSION_BUNDLE="$u" \
    OUT="$work/session6" bash "$session_sh" profile 2>&1) || { echo "$out" >&2; fail "profile"; }
  expect_in "ncu exit 0" "$out" "profile: ncu's exit"
  expect_in "(anonymous namespace)::big_kernel" "$(cat "$work/session6/profile.txt")" "profile.txt"
  grep -q '"launches": 3' "$work/session6/profile.json" || fail "profile.json: $(cat "$work/session6/profile.json")"
  [[ ! -e "$work/session6/ncu.err" ]] || fail "ncu.err left under \$OUT"
  rm "$u/bin/train"
  out=$(cd "$work" && env -i PATH=/usr/bin:/bin GPU_SESSION_BUNDLE="$u" bash "$session_sh" nope 2>&1) &&
    fail "gpu_session.sh took an unknown phase"
  expect_in "tools/gpu_session.sh tests" "$out" "gpu_session.sh usage"

  # collect refuses what it cannot bundle.
  printf '#!/bin/sh\necho hi\n' > "$work/script.sh"; chmod +x "$work/script.sh"
  out=$(GPU_BUNDLE_RUN_SH=$run_sh "$collect" "$work/bad" "$work/script.sh" 2>&1) && fail "collect took a script"
  expect_in "not an ELF binary" "$out" "collect of a script"
  echo "PASS (cpu)"
  exit 0
fi

[[ "$mode" == cuda ]] || fail "mode must be cpu or cuda, not $mode"
(( $# >= 1 )) || fail "cuda mode takes CUDA test binaries"
GPU_BUNDLE_RUN_SH=$run_sh GPU_BUNDLE_NO_TAR=1 "$collect" "$work/gpu_bundle" "$@"
b=$work/gpu_bundle
bundled_cuda=$(find "$b/lib" -maxdepth 1 -regextype egrep \
  -regex '.*/lib(cuda|cudart|cublas|cublasLt|cudnn|nccl)[._].*' -printf '%f ')
[[ -z "$bundled_cuda" ]] || fail "CUDA libraries were bundled: $bundled_cuda"
for t in "$@"; do
  name=$(basename "$t")
  grep -qx 'libcudart.so.13' "$b/bin/$name.cuda-libs" || fail "$name.cuda-libs lacks libcudart.so.13"
  grep -qx 'libcuda.so.1' "$b/bin/$name.cuda-libs" || fail "$name.cuda-libs lacks libcuda.so.1"
  echo "$name needs: $(tr '\n' ' ' < "$b/bin/$name.cuda-libs")"
  if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 ' || [[ -e /usr/local/nvidia/lib64/libcuda.so.1 ]]; then
    echo "a CUDA driver is here: running $name"
    env -i "$b/run.sh" "$name" || fail "$name failed on this GPU machine"
  else
    rc=0; out=$(env -i "$b/run.sh" "$name" 2>&1) || rc=$?
    (( rc == 127 )) || { echo "$out" >&2; fail "$name without a driver: status $rc, want 127"; }
    expect_in "no CUDA driver library (libcuda.so.1) found" "$out" "$name without a driver"
    echo "ok: $name stops without a driver: $(head -1 <<< "$out")"
    # With the toolkit here (it built them), the binaries load and the GPU tests skip.
    out=$(env -i GPU_BUNDLE_ALLOW_NO_DRIVER=1 "$b/run.sh" "$name" 2>&1) ||
      { echo "$out" >&2; fail "$name with GPU_BUNDLE_ALLOW_NO_DRIVER=1"; }
    expect_in "[  PASSED  ]" "$out" "$name with GPU_BUNDLE_ALLOW_NO_DRIVER=1"
    echo "ok: $name loads from the bundle and skips without a GPU"
  fi
done
echo "PASS (cuda)"
