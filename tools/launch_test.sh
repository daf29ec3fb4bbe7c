#!/bin/bash
# Tests //tools:launch with shell workers: env vars and line prefixes, a
# failing worker stopping the others, and --max_restarts.
set -u
LAUNCH="$1"
T="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*"; exit 1; }

# 1. Two workers print their environment.
# Their stdout's lines on stdout, their stderr's on stderr (as torchrun).
out=$("$LAUNCH" --nproc_per_node=2 --rdzv_endpoint=127.0.0.1:1234 -- \
  sh -c 'echo "RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE GROUP_RANK=$GROUP_RANK MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT"; echo "err line" >&2' \
  2> "$T/env.err") || fail "env run exited $?"
echo "$out"
for r in 0 1; do
  echo "$out" | grep -qx "\[rank $r\] RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 GROUP_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=1234" \
    || fail "rank $r env line missing"
  grep -qx "\[rank $r\] err line" "$T/env.err" || fail "rank $r stderr line missing"
done
[ "$(echo "$out" | wc -l)" -eq 2 ] || fail "expected 2 lines on stdout"
[ "$(grep -c '^\[rank' "$T/env.err")" -eq 2 ] || { cat "$T/env.err"; fail "expected 2 worker lines on stderr"; }

# FSDP_NUM_THREADS, OMP_NUM_THREADS, OPENBLAS_NUM_THREADS: the cores shared by
# the node's workers, each unless set (the cores as the launcher counts them:
# its affinity mask, which nproc may not report).
out=$(env -u FSDP_NUM_THREADS -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS "$LAUNCH" --nproc_per_node=2 -- \
  sh -c 'echo "threads=$FSDP_NUM_THREADS,$OMP_NUM_THREADS,$OPENBLAS_NUM_THREADS"' 2> "$T/threads.err") \
  || fail "threads run exited $?"
cores=$(sed -n 's/^launch: each worker gets FSDP_NUM_THREADS=[0-9]* OMP_NUM_THREADS=[0-9]* OPENBLAS_NUM_THREADS=[0-9]* (\([0-9]*\) cores[^,]*, 2 workers).*/\1/p' "$T/threads.err")
[ -n "$cores" ] || fail "no line saying the threads: $(cat "$T/threads.err")"
want=$(( cores / 2 )); [ $want -ge 1 ] || want=1
[ "$(echo "$out" | sort -u)" = "[rank 0] threads=$want,$want,$want
[rank 1] threads=$want,$want,$want" ] || fail "thread counts for 2 workers on $cores cores: $out"
out=$(FSDP_NUM_THREADS=3 env -u OMP_NUM_THREADS "$LAUNCH" --nproc_per_node=2 -- \
  sh -c 'echo "threads=$FSDP_NUM_THREADS,$OMP_NUM_THREADS"' 2>/dev/null) || fail "threads run 2 exited $?"
[ "$(echo "$out" | sed 's/^\[rank [01]\] //' | sort -u)" = "threads=3,$want" ] \
  || fail "FSDP_NUM_THREADS=3 not kept, or OMP_NUM_THREADS not set: $out"

# Second node of two: global ranks 2, 3.
out=$("$LAUNCH" --nproc_per_node=2 --nnodes=2 --node_rank=1 --rdzv_endpoint=10.0.0.1:29400 -- \
  sh -c 'echo "RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE GROUP_RANK=$GROUP_RANK $MASTER_ADDR:$MASTER_PORT"') \
  || fail "node 1 run exited $?"
echo "$out" | grep -qx "\[rank 3\] RANK=3 LOCAL_RANK=1 WORLD_SIZE=4 GROUP_RANK=1 10.0.0.1:29400" || fail "node 1 rank 3"

# RUN_ID: one fresh id per launch, the same for every worker; --rdzv_id sets
# it; several nodes without --rdzv_id share "none" (as torchrun).
ids1=$("$LAUNCH" --nproc_per_node=2 -- sh -c 'echo "id=$RUN_ID"') || fail "run id run 1"
ids2=$("$LAUNCH" --nproc_per_node=2 -- sh -c 'echo "id=$RUN_ID"') || fail "run id run 2"
echo "$ids1"; echo "$ids2"
[ "$(echo "$ids1" | sed 's/^\[rank [01]\] //' | sort -u | wc -l)" -eq 1 ] || fail "workers of one launch got different RUN_IDs"
echo "$ids1" | grep -qx '\[rank 0\] id=[0-9]*-[0-9]*' || fail "RUN_ID missing or malformed: $ids1"
id1=$(echo "$ids1" | grep '^\[rank 0\]'); id2=$(echo "$ids2" | grep '^\[rank 0\]')
[ "$id1" != "$id2" ] || fail "two launches got the same RUN_ID: $id1"
out=$("$LAUNCH" --nproc_per_node=1 --rdzv_id=job42 -- sh -c 'echo "id=$RUN_ID"') || fail "rdzv_id run"
[ "$out" = "[rank 0] id=job42" ] || fail "--rdzv_id not passed as RUN_ID: $out"
out=$("$LAUNCH" --nproc_per_node=1 --nnodes=2 --node_rank=0 --rdzv_endpoint=10.0.0.1:29400 -- \
  sh -c 'echo "id=$RUN_ID"') || fail "multi-node run id run"
[ "$out" = "[rank 0] id=none" ] || fail "multi-node default RUN_ID: $out"
"$LAUNCH" --nproc_per_node=1 --rdzv_id= -- true 2>/dev/null && fail "empty --rdzv_id accepted"
"$LAUNCH" --nproc_per_node=1 --nnodes=2 --rdzv_endpoint=10.0.0.1:29400 --max_restarts=1 -- true \
  2> "$T/restarts.err" && fail "--max_restarts with several nodes accepted"
grep -q "max_restarts needs --nnodes=1" "$T/restarts.err" || fail "restarts message: $(cat "$T/restarts.err")"

# 2. Rank 1 exits 3; rank 0 sleeps (and ignores SIGTERM, so SIGKILL is needed).
start=$(date +%s)
out=$("$LAUNCH" --nproc_per_node=2 --grace_period_s=1 -- \
  sh -c 'if [ "$RANK" = 1 ]; then sleep 0.3; exit 3; fi; echo $$ > '"$T"'/pid0; trap "" TERM; sleep 100' 2>&1)
rc=$?
took=$(( $(date +%s) - start ))
echo "$out"
[ $rc -ne 0 ] || fail "launcher succeeded although rank 1 failed"
echo "$out" | grep -q "rank 1 (local rank 1, pid [0-9]*) failed with exit status 3" || fail "no message naming rank 1 and status 3"
echo "$out" | grep -q "rank 0 did not stop within 1 s of SIGTERM; sending SIGKILL" || fail "no SIGKILL of rank 0"
[ $took -le 6 ] || fail "took $took s"
pid0=$(cat "$T/pid0")
kill -0 "$pid0" 2>/dev/null && fail "rank 0 (pid $pid0) still running"

# A worker killed by a signal is named with the signal.
out=$("$LAUNCH" --nproc_per_node=1 -- sh -c 'kill -9 $$' 2>&1) && fail "signal run succeeded"
echo "$out" | grep -q "rank 0 (local rank 0, pid [0-9]*) failed with signal 9" || fail "signal not named: $out"

# A killed worker is the root cause even when the peer it took down is reaped
# first (rank 0 exits 1 at once, as a worker does on losing a peer; rank 1 is
# killed 50 ms later, within the launcher's settling window).
out=$("$LAUNCH" --nproc_per_node=2 -- \
  sh -c 'if [ "$RANK" = 0 ]; then exit 1; fi; sleep 0.05; kill -9 $$' 2>&1) && fail "run succeeded"
echo "$out"
echo "$out" | grep -q "launch: rank 1 (local rank 1, pid [0-9]*) failed with signal 9 (Killed)" ||
  fail "root cause not the killed rank 1"
echo "$out" | grep -q "launch: rank 0 (local rank 0, pid [0-9]*) also failed with exit status 1" ||
  fail "rank 0's failure not listed"
echo "$out" | grep -q "giving up: rank 1 failed with signal 9" || fail "give-up names the wrong rank"

# 3. --max_restarts=1: rank 1 fails on the first attempt only.
out=$("$LAUNCH" --nproc_per_node=2 --max_restarts=1 -- \
  sh -c 'echo "attempt $RESTART_COUNT"; if [ "$RANK" = 1 ] && [ ! -e '"$T"'/failed_once ]; then touch '"$T"'/failed_once; exit 3; fi; sleep 0.2' 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || fail "restart run exited $rc"
echo "$out" | grep -q "restarting all 2 workers (restart 1 of 1)" || fail "no restart message"
echo "$out" | grep -qx "\[rank 0\] attempt 1" || fail "rank 0 not restarted"
echo "$out" | grep -qx "\[rank 1\] attempt 1" || fail "rank 1 not restarted"
# LAUNCH_ID: this launch's, the same for its restarts, whatever --rdzv_id says.
out=$("$LAUNCH" --nproc_per_node=1 --max_restarts=1 --rdzv_id=fixed -- \
  sh -c 'echo "launch $LAUNCH_ID run $RUN_ID"; [ "$RESTART_COUNT" = 1 ]' 2>/dev/null)
[ "$(echo "$out" | sort -u | wc -l)" -eq 1 ] || fail "LAUNCH_ID changed on a restart: $out"
echo "$out" | head -1 | grep -Eq "^\[rank 0\] launch [0-9]+-[0-9]+ run fixed$" ||
  fail "LAUNCH_ID / RUN_ID: $out"

# Always failing: one restart, then give up.
out=$("$LAUNCH" --nproc_per_node=1 --max_restarts=1 -- sh -c 'echo "attempt $RESTART_COUNT"; exit 3' 2>&1) \
  && fail "always-failing run succeeded"
[ "$(echo "$out" | grep -c '^\[rank 0\] attempt')" -eq 2 ] || fail "expected exactly 2 attempts: $out"
echo "$out" | grep -q "giving up: rank 0 failed with exit status 3 after 1 restarts" || fail "no give-up message"

# 4. A worker that leaves a child running in the background: the launch ends
# (it waited for ever on the child's hold of the output pipe) and the child
# is killed with the worker's process group, after success and failure alike.
alive() { pgrep -f "sleep $1" > /dev/null; }
out=$(timeout 60 "$LAUNCH" --nproc_per_node=1 -- sh -c 'sleep 9871 & echo started' 2>&1) \
  || fail "a worker with a background child: exit $? ($out)"
echo "$out" | grep -qx "\[rank 0\] started" || fail "worker output lost: $out"
sleep 0.5; alive 9871 && fail "the background child of a finished worker still runs"
out=$(timeout 60 "$LAUNCH" --nproc_per_node=1 --max_restarts=1 -- sh -c 'sleep 9872 & exit 3' 2>&1)
[ $? -eq 1 ] || fail "failing worker with a background child: expected exit 1 ($out)"
echo "$out" | grep -q "giving up: rank 0 failed with exit status 3 after 1 restarts" || fail "$out"
sleep 0.5; alive 9872 && fail "the background child of a failed worker still runs"

# A child that left the worker's process group (setsid) and keeps writing to
# its output: the launch still ends, within a few seconds of the worker.
start=$(date +%s)
out=$(timeout 60 "$LAUNCH" --nproc_per_node=1 -- \
  sh -c 'setsid sh -c "while true; do echo tick; sleep 0.2; done # 9876" & echo started' 2>&1) \
  || fail "a worker with an escaped writer: exit $?"
took=$(( $(date +%s) - start ))
pkill -f "# 9876"
[ "$took" -le 10 ] || fail "the launch waited ${took}s for an escaped writer"
echo "$out" | grep -qx "\[rank 0\] started" || fail "worker output lost: $out"

# A worker's last output reaches a slow reader whole (what the pipe held when
# the worker ended is copied, however long that takes; the bound above is for
# what comes after it).
lines=$(python3 -c '
import fcntl, os, subprocess, sys, time
r, w = os.pipe()
fcntl.fcntl(r, 1031, 4096)  # F_SETPIPE_SZ: the launch cannot run ahead of this reader
launch = subprocess.Popen([sys.argv[1], "--nproc_per_node=1", "--", "seq", "-f",
                           "line-padding-padding-padding-%g", "1", "2500"], stdout=w)
os.close(w)
data = b""
while True:
    chunk = os.read(r, 4096)
    if not chunk:
        break
    data += chunk
    time.sleep(0.2)  # 20 KB/s: the 64 KiB left in the workers pipe take 3 s
launch.wait()
lines = data.decode().splitlines()
print(len(lines), lines[-1])' "$LAUNCH")
[ "$lines" = "2500 [rank 0] line-padding-padding-padding-2500" ] ||
  fail "a slow reader got: $lines"

# 5. A launcher killed with SIGKILL takes its workers with it (PR_SET_PDEATHSIG).
"$LAUNCH" --nproc_per_node=2 -- sh -c 'echo $$ > "'"$T"'/pid_$RANK"; exec sleep 9873' > /dev/null 2>&1 &
launcher=$!
for _ in $(seq 100); do [ -s "$T/pid_0" ] && [ -s "$T/pid_1" ] && break; sleep 0.1; done
kill -9 "$launcher"; wait "$launcher" 2> /dev/null
for _ in $(seq 50); do alive 9873 || break; sleep 0.1; done
alive 9873 && { pkill -f "sleep 9873"; fail "workers outlived their SIGKILLed launcher"; }

# torchrun's forms: the command without "--", a flag's value after a space,
# dashed spellings, --standalone; --help prints the usage and exits 0.
out=$("$LAUNCH" --nproc-per-node 2 --standalone sh -c 'echo "w $RANK/$WORLD_SIZE"' 2>&1) ||
  { echo "$out"; fail "torchrun-style command line"; }
[ "$(echo "$out" | grep -c "w [01]/2")" -eq 2 ] || { echo "$out"; fail "torchrun-style workers"; }
"$LAUNCH" --help | grep -q "^usage: launch \[--nproc_per_node=1\]" || fail "--help"
"$LAUNCH" --help | grep -q "^  --max_restarts=N  *restart every worker up to N times" ||
  fail "--help describes the flags"
# Without --nproc_per_node: one worker, as torchrun starts.
out=$("$LAUNCH" -- sh -c 'echo "w $RANK/$WORLD_SIZE"') || fail "no --nproc_per_node: exit $?"
[ "$out" = "[rank 0] w 0/1" ] || fail "no --nproc_per_node: $out"
"$LAUNCH" --nproc_per_node=1 --bogus=1 -- true 2>"$T/usage.err"
[ $? -eq 2 ] && grep -q "unknown flag --bogus (the worker command goes after" "$T/usage.err" ||
  fail "unknown flag message"

# Usage errors.
"$LAUNCH" --nproc_per_node=2 2>/dev/null && fail "no command accepted"
"$LAUNCH" --nproc_per_node=2 --nnodes=2 -- true 2>/dev/null && fail "multi-node without endpoint accepted"
# Out-of-range integers are refused, not wrapped (4294967297 is not 1 worker).
for bad in --nproc_per_node=4294967297 --nproc_per_node=100000 "--nproc_per_node=2 --nnodes=2147483647"; do
  # shellcheck disable=SC2086
  "$LAUNCH" $bad --rdzv_endpoint=127.0.0.1:1234 -- true 2>"$T/usage.err"
  [ $? -eq 2 ] || fail "$bad accepted"
done
grep -q "nnodes x --nproc_per_node must fit an int" "$T/usage.err" || fail "overflow message"
# Each out-of-range flag is named with its value.
for bad in "--nnodes=0|--nnodes must be >= 1, got 0" \
    "--nnodes=2 --node_rank=2|--node_rank must be in [0, --nnodes=2), got 2" \
    "--max_restarts=-1|--max_restarts must be >= 0, got -1" \
    "--grace_period_s=-3|--grace_period_s must be >= 0, got -3"; do
  # shellcheck disable=SC2086
  "$LAUNCH" ${bad%%|*} --rdzv_endpoint=127.0.0.1:1234 -- true 2>"$T/usage.err"
  [ $? -eq 2 ] || fail "${bad%%|*} accepted"
  grep -qF -- "${bad#*|}" "$T/usage.err" || fail "${bad%%|*}: $(cat "$T/usage.err")"
done
"$LAUNCH" --nproc_per_node=1 --rdzv_endpoint=localhost:70000 -- true 2>"$T/usage.err"
[ $? -eq 2 ] || fail "port 70000 accepted"
grep -q "a port in \[1, 65535\]" "$T/usage.err" || fail "port message"
"$LAUNCH" --nproc_per_node=1 --rdzv_endpoint=:29500 -- true 2>"$T/usage.err"
[ $? -eq 2 ] || fail "an endpoint without a host accepted"
grep -q 'must be host:port (a host, .*got ":29500"' "$T/usage.err" || fail "host message"

# A worker that cannot be started (too few file descriptors for its pipe):
# the launcher stops the ones started, says why, exits 1 (it used to abort).
out=$( (ulimit -n 12; "$LAUNCH" --nproc_per_node=12 -- sleep 9874) 2>&1)
rc=$?
[ $rc -eq 1 ] || { echo "$out"; fail "start failure exited $rc, wanted 1"; }
echo "$out" | grep -q "launch: cannot start local rank [0-9]* of 12: pipe: Too many open files; stopping the workers started" \
  || { echo "$out"; fail "start failure message"; }
pgrep -f "sleep 9874" > /dev/null && { pkill -f "sleep 9874"; fail "started workers outlived a failed start"; }

# 6. A reader of the launcher's output that went away (`| tee` after Ctrl-C):
# the launcher's next line no longer kills it (SIGPIPE, exit 141) before it
# stops the workers; the worker that ignores SIGTERM gets SIGKILL after the
# grace period as always, and the launch exits 128 + SIGTERM.
mkfifo "$T/gone_reader"
"$LAUNCH" --grace_period_s=1 -- sh -c 'trap "" TERM; echo started; exec sleep 9876' \
  > "$T/gone_reader" 2>&1 &
L=$!
exec 3< "$T/gone_reader"; read -r _ <&3; exec 3<&-
sleep 0.3; kill -TERM $L; wait $L; rc=$?
for _ in $(seq 40); do alive 9876 || break; sleep 0.1; done
alive 9876 && { pkill -f "sleep 9876"; fail "a worker outlived a launcher whose reader went away"; }
[ $rc -eq 143 ] || fail "the launcher whose reader went away exited $rc, wanted 143 (141: SIGPIPE)"

# A reader that goes away while the workers write (`| head`): the launch
# stops them (it used to run on, its output discarded) and exits 141, as
# its death by SIGPIPE would show; its message reaches stderr.
out=$( { timeout 30 "$LAUNCH" --nproc_per_node=2 -- \
           sh -c 'while :; do echo tick 9877; sleep 0.05; done' 2> "$T/head.err";
         echo "rc=$?" > "$T/head.rc"; } | head -n 3)
[ "$(echo "$out" | wc -l)" -eq 3 ] || fail "| head -n 3 got: $out"
grep -qx "rc=141" "$T/head.rc" ||
  { cat "$T/head.err"; fail "a launch whose reader went away: $(cat "$T/head.rc")"; }
grep -q "launch: the reader of the launch's output went away (EPIPE); stopping the workers" \
  "$T/head.err" || { cat "$T/head.err"; fail "no message for the reader that went away"; }
pgrep -f "tick 9877" > /dev/null && { pkill -f "tick 9877"; fail "workers outlived a gone reader"; }
# The same through stderr, which is unbuffered (a failed write is what
# says it, not a flush): workers that only log there.
{ timeout 30 "$LAUNCH" --nproc_per_node=2 -- \
    sh -c 'while :; do echo tock 9880 >&2; sleep 0.05; done' 2>&1 > /dev/null;
  echo "rc=$?" > "$T/head_err.rc"; } | head -n 3 > /dev/null
grep -qx "rc=141" "$T/head_err.rc" ||
  fail "a launch whose stderr reader went away: $(cat "$T/head_err.rc")"
pgrep -f "tock 9880" > /dev/null &&
  { pkill -f "tock 9880"; fail "workers outlived a gone stderr reader"; }

# A launcher started with SIGTERM ignored still stops on it, and its
# workers do not inherit it ignored: its death by SIGKILL still ends them
# (their PR_SET_PDEATHSIG is SIGTERM).
rm -f "$T"/pid_*
( trap '' TERM; exec "$LAUNCH" --nproc_per_node=2 -- \
    sh -c 'echo $$ > "'"$T"'/pid_$RANK"; exec sleep 9878' > /dev/null 2>&1 ) &
launcher=$!
for _ in $(seq 100); do [ -s "$T/pid_0" ] && [ -s "$T/pid_1" ] && break; sleep 0.1; done
[ -s "$T/pid_0" ] && [ -s "$T/pid_1" ] ||
  { kill -9 "$launcher"; fail "the workers of a launcher started ignoring SIGTERM did not start"; }
kill -9 "$launcher"; wait "$launcher" 2> /dev/null
for _ in $(seq 50); do alive 9878 || break; sleep 0.1; done
alive 9878 &&
  { pkill -f "sleep 9878"; fail "workers of a launcher started ignoring SIGTERM outlived it"; }
rm -f "$T"/pid_*
( trap '' TERM; exec "$LAUNCH" -- \
    sh -c 'echo $$ > "'"$T"'/pid_$RANK"; exec sleep 9879' > /dev/null 2>&1 ) &
launcher=$!
# The worker runs once the launcher's handlers are in place (its pid file,
# not the launcher's own command line, which names the worker's too); then
# SIGTERM, and a bounded wait (a launcher that ignored it would sleep on).
for _ in $(seq 100); do [ -s "$T/pid_0" ] && break; sleep 0.1; done
[ -s "$T/pid_0" ] ||
  { kill -9 "$launcher"; fail "the worker of a launcher started ignoring SIGTERM did not start"; }
kill -TERM "$launcher"
for _ in $(seq 100); do kill -0 "$launcher" 2> /dev/null || break; sleep 0.1; done
kill -0 "$launcher" 2> /dev/null &&
  { kill -9 "$launcher"; pkill -f "sleep 9879"; fail "a launcher started ignoring SIGTERM ran on"; }
wait "$launcher"; rc=$?
alive 9879 && { pkill -f "sleep 9879"; fail "SIGTERM to a launcher started ignoring it"; }
[ $rc -eq 143 ] || fail "SIGTERM to a launcher started ignoring it: exit $rc, wanted 143"

# Under nohup a hangup stops neither the launcher nor its workers (SIGHUP
# stays ignored, in the workers too).
nohup "$LAUNCH" -- sh -c 'sleep 1; echo "still here"' > "$T/nohup.out" 2>&1 &
L=$!
sleep 0.4; kill -HUP $L; wait $L; rc=$?
[ $rc -eq 0 ] || { cat "$T/nohup.out"; fail "a launch under nohup exited $rc on SIGHUP"; }
grep -qx "\[rank 0\] still here" "$T/nohup.out" || { cat "$T/nohup.out"; fail "nohup worker output"; }

# A worker that reads stdin while the launcher's is a terminal reads
# /dev/null (end of file), not the terminal: it was stopped by SIGTTIN in
# its own process group, unseen, and the launch hung. (Where a pty can be
# made here.)
if script -qec true /dev/null > /dev/null 2>&1; then
  out=$(timeout 20 script -qec "$LAUNCH -- sh -c 'read v; echo read=\$?'" /dev/null < /dev/null)
  rc=$?
  [ $rc -eq 0 ] || { echo "$out"; fail "a worker reading the terminal: the launch exited $rc"; }
  echo "$out" | tr -d '\r' | grep -qx "\[rank 0\] read=1" || { echo "$out"; fail "stdin read"; }
fi
echo PASS
