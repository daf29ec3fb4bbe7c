#!/usr/bin/env bash
# //models/mingpt:train over gloo when a worker dies or hangs:
#  1. kill -9 one of two workers started by //tools:launch: the launcher exits
#     non-zero at once, naming the rank and the signal, and no worker is left.
#  2. the same without a launcher: the surviving worker notices the lost peer
#     by itself and exits non-zero (within --timeout_s) naming rank 1.
#  3. a worker that hangs (SIGSTOP): the other's collective times out after
#     --timeout_s naming rank 1; the launcher then stops the hung worker
#     (SIGKILL after the grace period) and exits non-zero within
#     --timeout_s + --grace_period_s (+ slack for a loaded machine).
#  4. ZeRO-1 with a hung worker and no launcher: the other's collective
#     times out after --timeout_s naming rank 1.
#  5. HYBRID_SHARD over 4 workers (2 shard groups of 2) with no launcher:
#     kill -9 rank 3; each survivor exits non-zero by itself, naming the
#     lost peer or the rank it waited for (rank 2, rank 3's shard-group peer:
#     rank 3, or in its group's numbering "rank 1 (world 3)").
#  6. two nodes of 2 ranks (two launchers, a shared --rdzv folder), node 1's
#     --data missing: its ranks fail before joining and each says so in the
#     store; node 0's ranks, waiting with --timeout_s=120, fail at once
#     naming rank 2 or 3 and why (each node's launcher stops only its own
#     workers).
set -uo pipefail
launch="$1"
train="$2"
dir="${TEST_TMPDIR}/gloo_failure"
mkdir -p "$dir/tmp"
export TMPDIR="$dir/tmp"
fail() { echo "FAIL: $*"; exit 1; }

# A run far longer than the test: it only ends by failing.
long=(--preset=gpt-nano --data=random --steps=1000000 --batch_size=2 --seq_len=32 --log_every=1)

# wait_for FILE PATTERN SECONDS: until the file has a line matching PATTERN.
wait_for() {
  local deadline=$(( $(date +%s) + $3 ))
  until grep -q -- "$2" "$1" 2>/dev/null; do
    [[ $(date +%s) -lt $deadline ]] || { cat "$1"; fail "no '$2' in $1 within $3 s"; }
    sleep 0.2
  done
}
# worker_pid PARENT RANK: the child of PARENT whose environment has RANK=<RANK>.
worker_pid() {
  local d
  for d in /proc/[0-9]*; do
    [[ "$(awk '/^PPid:/ { print $2 }' "$d/status" 2>/dev/null)" == "$1" ]] || continue
    if tr '\0' '\n' < "$d/environ" 2>/dev/null | grep -qx "RANK=$2"; then
      echo "${d#/proc/}"
      return
    fi
  done
}
# wait_exit PID SECONDS: waits for a child of this shell, fails after SECONDS;
# sets rc and took.
wait_exit() {
  local start=$(date +%s)
  local deadline=$(( start + $2 ))
  while kill -0 "$1" 2>/dev/null; do
    if [[ $(date +%s) -ge $deadline ]]; then
      kill -9 "$1" 2>/dev/null
      fail "pid $1 still running after $2 s"
    fi
    sleep 0.1
  done
  wait "$1"
  rc=$?
  took=$(( $(date +%s) - start ))
}

# ---- 1. kill -9 a worker under the launcher ----
"$launch" --nproc_per_node=2 --grace_period_s=2 --rdzv_endpoint=127.0.0.1:29541 -- \
  "$train" "${long[@]}" --backend=gloo --timeout_s=20 > "$dir/killed.log" 2>&1 &
lpid=$!
wait_for "$dir/killed.log" "^\[rank 0\] step     2 " 60
r0=$(worker_pid $lpid 0)
r1=$(worker_pid $lpid 1)
[[ -n "$r0" && -n "$r1" ]] || fail "workers of launcher $lpid not found"
kill -9 "$r1"
wait_exit $lpid $(( 20 + 2 + 10 ))
cat "$dir/killed.log"
[[ $rc == 1 ]] || fail "launcher exited $rc after a worker was killed"
grep -q "launch: rank 1 (local rank 1, pid $r1) failed with signal 9 (Killed)" "$dir/killed.log" ||
  fail "the launcher did not name rank 1 and the signal"
grep -q "launch: giving up: rank 1 failed with signal 9" "$dir/killed.log" || fail "no give-up line"
kill -0 "$r0" 2>/dev/null && fail "rank 0 (pid $r0) still running"
echo "1. killed worker: launcher exited $rc after $took s naming rank 1"

# ---- 2. kill -9 a worker with no launcher: the survivor exits by itself ----
job=(WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29542 RUN_ID="bare-$$")
env "${job[@]}" RANK=0 LOCAL_RANK=0 "$train" "${long[@]}" --backend=gloo --timeout_s=20 \
  > "$dir/bare0.log" 2>&1 &
p0=$!
env "${job[@]}" RANK=1 LOCAL_RANK=1 "$train" "${long[@]}" --backend=gloo --timeout_s=20 \
  > "$dir/bare1.log" 2>&1 &
p1=$!
wait_for "$dir/bare0.log" "^step     2 " 60
kill -9 $p1
wait $p1 2>/dev/null
wait_exit $p0 $(( 20 + 10 ))
tail -3 "$dir/bare0.log"
[[ $rc == 1 ]] || fail "the surviving rank 0 exited $rc"
grep -Eq "^train: error: rank 0: .*(lost a peer(: rank 1 exited \(pid $p1 | \(one of rank 1 )|waiting for rank 1)" \
  "$dir/bare0.log" ||
  fail "rank 0's error does not name rank 1"
echo "2. survivor: rank 0 exited $rc after $took s naming rank 1"

# ---- 3. a hung worker (SIGSTOP) under the launcher: the timeout fires ----
"$launch" --nproc_per_node=2 --grace_period_s=2 --rdzv_endpoint=127.0.0.1:29543 -- \
  "$train" "${long[@]}" --backend=gloo --timeout_s=5 > "$dir/hung.log" 2>&1 &
lpid=$!
wait_for "$dir/hung.log" "^\[rank 0\] step     2 " 60
r0=$(worker_pid $lpid 0)
r1=$(worker_pid $lpid 1)
[[ -n "$r0" && -n "$r1" ]] || fail "workers of launcher $lpid not found"
kill -STOP "$r1"
wait_exit $lpid $(( 5 + 2 + 15 ))
cat "$dir/hung.log" | tail -6
[[ $rc == 1 ]] || fail "launcher exited $rc after a worker hung"
grep -Eq "^\[rank 0\] train: error: rank 0: .*timed out after 5.0 s waiting for rank 1" "$dir/hung.log" ||
  fail "rank 0 did not time out naming rank 1"
grep -q "launch: rank 0 (local rank 0, pid $r0) failed with exit status 1" "$dir/hung.log" ||
  fail "the launcher did not name rank 0"
grep -q "launch: rank 1 did not stop within 2 s of SIGTERM; sending SIGKILL" "$dir/hung.log" ||
  fail "the hung rank 1 was not killed"
kill -0 "$r1" 2>/dev/null && fail "the hung rank 1 (pid $r1) still running"
echo "3. hung worker: rank 0 timed out, launcher exited $rc after $took s"

# ---- 4. ZeRO-1, a hung worker with no launcher: the timeout fires ----
job=(WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29544 RUN_ID="z1-$$")
zero1=("${long[@]}" --backend=gloo --strategy=zero1 --timeout_s=10)
env "${job[@]}" RANK=0 LOCAL_RANK=0 "$train" "${zero1[@]}" > "$dir/zero1_0.log" 2>&1 &
p0=$!
env "${job[@]}" RANK=1 LOCAL_RANK=1 "$train" "${zero1[@]}" > "$dir/zero1_1.log" 2>&1 &
p1=$!
wait_for "$dir/zero1_0.log" "^step     2 " 60
grep -q "ZeRO-1" "$dir/zero1_0.log" || { cat "$dir/zero1_0.log"; fail "not a ZeRO-1 run"; }
kill -STOP $p1
wait_exit $p0 $(( 10 + 15 ))
kill -9 $p1
wait $p1 2>/dev/null
tail -3 "$dir/zero1_0.log"
[[ $rc == 1 ]] || fail "ZeRO-1: rank 0 exited $rc after rank 1 hung"
grep -Eq "^train: error: rank 0: .*timed out after 10.0 s waiting for rank 1" "$dir/zero1_0.log" ||
  fail "ZeRO-1: rank 0 did not time out naming rank 1"
echo "4. ZeRO-1, hung worker: rank 0 timed out after $took s naming rank 1"

# ---- 5. HYBRID_SHARD over 4 workers, kill -9 one: every survivor exits ----
job=(WORLD_SIZE=4 LOCAL_WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=29545 RUN_ID="hy-$$")
hybrid=("${long[@]}" --backend=gloo --strategy=hybrid_shard --hybrid_shard_group_size=2
        --timeout_s=20)
pids=()
for r in 0 1 2 3; do
  env "${job[@]}" RANK=$r LOCAL_RANK=$r "$train" "${hybrid[@]}" > "$dir/hybrid$r.log" 2>&1 &
  pids+=($!)
done
wait_for "$dir/hybrid0.log" "^step     2 " 120
grep -q "FSDP HYBRID_SHARD" "$dir/hybrid0.log" ||
  { cat "$dir/hybrid0.log"; fail "not a HYBRID run"; }
kill -9 "${pids[3]}"
wait "${pids[3]}" 2>/dev/null
for r in 0 1 2; do
  wait_exit "${pids[$r]}" $(( 20 + 20 ))
  tail -2 "$dir/hybrid$r.log"
  [[ $rc == 1 ]] || fail "HYBRID: rank $r exited $rc after rank 3 was killed"
  grep -Eq "^train: error: rank $r: .*(lost a peer|timed out after 20.0 s waiting for)" \
    "$dir/hybrid$r.log" || fail "HYBRID: rank $r's error names no lost or awaited peer"
done
grep -Eq "^train: error: rank 2: .*(rank 3 |rank 1 \(world 3\))" "$dir/hybrid2.log" ||
  fail "HYBRID: rank 2 (rank 3's shard-group peer) does not name rank 3"
echo "5. HYBRID_SHARD, killed worker: ranks 0-2 exited 1, rank 2 naming rank 3"

# ---- 6. two nodes, node 1's --data missing: node 0 fails at once ----
nodes=()
for node in 0 1; do
  data=random
  [[ $node == 1 ]] && data="$dir/missing_on_node1.txt"
  "$launch" --nproc_per_node=2 --nnodes=2 --node_rank=$node --rdzv_endpoint=127.0.0.1:29546 \
    --rdzv_id="nodes-$$" -- "$train" "${long[@]}" --data="$data" --backend=gloo \
    --strategy=ddp --timeout_s=120 --rdzv="$dir/shared_rdzv" > "$dir/node$node.log" 2>&1 &
  nodes+=($!)
done
wait_exit "${nodes[1]}" 60
[[ $rc == 1 ]] || { cat "$dir/node1.log"; fail "node 1's launcher exited $rc"; }
wait_exit "${nodes[0]}" 60
tail -2 "$dir/node0.log"
[[ $rc == 1 ]] || fail "node 0's launcher exited $rc after node 1 failed"
# (Of ranks 2 and 3, which fail at once, the lowest whose word is there when it reads.)
grep -Eq "^\[rank 0\] train: error: .*rank 0 of 4: rank [23] \(host .* pid [0-9]+\) failed before \
joining: --data=$dir/missing_on_node1.txt" "$dir/node0.log" ||
  fail "node 0's rank 0 does not name rank 2 or 3 and its --data"
! grep -q "could not tell" "$dir/node1.log" || { cat "$dir/node1.log"; fail "a rank could not say"; }
echo "6. two nodes, node 1's --data missing: node 0 exited 1 after $took s naming a failed rank"
echo PASS
