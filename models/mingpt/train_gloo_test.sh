#!/usr/bin/env bash
# //models/mingpt:train over processes: two workers started by //tools:launch
# with --backend=gloo (loopback, the default FileStore rendezvous) print the
# per-step losses of the threads engine at the same world size, for FSDP
# FULL_SHARD, DDP and ZeRO-1 (dropout on: both engines seed it alike). Only
# rank 0 logs steps; each rank prints its own peak-memory line. A restart
# rendezvouses under fresh keys (a rank that died in the first attempt left
# keys behind). --init_from reads only each process's FSDP shard of a
# checkpoint (one-process, sharded, or a Hugging Face folder). Bad launch environments and flags are clear errors (exit 2).
set -euo pipefail
# The same thread counts in the launched workers as in the one-process runs
# they are compared with (the launcher would give each its share of the
# cores, and bf16 GEMMs round differently with another OpenMP team size).
export FSDP_NUM_THREADS=2 OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2
launch="$1"
train="$2"
source "$3"  # models/common/cli_testing.sh: exits_2
checkpoint="$4"
dir="${TEST_TMPDIR}/gloo"
mkdir -p "$dir"
export TMPDIR="$dir/tmp"  # the default rendezvous directory goes under it
mkdir -p "$TMPDIR"

common=(--preset=gpt-nano --data=random --steps=4 --batch_size=2 --seq_len=32 --log_every=1
        --timeout_s=120)
losses() { sed -E 's/.*"step":([0-9]+),"loss":([0-9.]+).*/\1 \2/' "$1"; }
# same_losses A B NAME: the same steps, losses within 2e-6 (the JSON keeps 6
# decimals; the engines add the same two numbers, so they are normally equal).
same_losses() {
  [[ $(losses "$1" | wc -l) == 4 ]] || { echo "$3: expected 4 steps in $1"; cat "$1"; exit 1; }
  paste -d' ' <(losses "$1") <(losses "$2") |
    awk -v s="$3" '{ d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 2e-6) {
      print s ": step " $1 " threads " $2 " vs gloo " $4; bad = 1 } } END { exit bad }'
}

for strategy in full_shard ddp zero1; do
  "$train" "${common[@]}" --world_size=2 --strategy=$strategy \
    --metrics_out="$dir/threads_$strategy.jsonl" > "$dir/threads_$strategy.log"
  "$launch" --nproc_per_node=2 --rdzv_endpoint=127.0.0.1:29531 -- \
    "$train" "${common[@]}" --backend=gloo --strategy=$strategy \
    --metrics_out="$dir/gloo_$strategy.jsonl" > "$dir/gloo_$strategy.log" 2>&1 ||
    { echo "gloo $strategy run failed:"; cat "$dir/gloo_$strategy.log"; exit 1; }
  cat "$dir/gloo_$strategy.log"
  same_losses "$dir/threads_$strategy.jsonl" "$dir/gloo_$strategy.jsonl" "$strategy"
  log="$dir/gloo_$strategy.log"
  grep -q "^\[rank 0\] data: .* | 2 ranks (gloo) x batch 2 x 32 tokens" "$log"
  grep -q "^\[rank 0\] step     4 | loss" "$log"
  if grep -q "^\[rank 1\] step" "$log"; then echo "rank 1 printed step lines"; exit 1; fi
  for r in 0 1; do
    grep -Eq "^\[rank $r\] peak memory of rank $r by category \(MiB, ledger\): params [0-9.]+ grads [0-9.]+ optim [0-9.]+ activ [0-9.]+ comm [0-9.]+ temp [0-9.]+ total [0-9.]+$" "$log"
  done
  echo "gloo $strategy: losses equal the threads engine's"
done
# HYBRID_SHARD over 4 processes: shard groups of LOCAL_WORLD_SIZE=2 (two
# "nodes" of 2 ranks each: --nnodes is emulated by two launchers), replicated
# across them; equal to the threads engine with --hybrid_shard_group_size=2.
"$train" "${common[@]}" --world_size=4 --batch_size=1 --strategy=hybrid_shard \
  --hybrid_shard_group_size=2 --metrics_out="$dir/threads_hybrid.jsonl" > "$dir/threads_hybrid.log"
for node in 0 1; do
  "$launch" --nproc_per_node=2 --nnodes=2 --node_rank=$node --rdzv_endpoint=127.0.0.1:29533 \
    --rdzv_id=hybrid -- "$train" "${common[@]}" --batch_size=1 --backend=gloo \
    --strategy=hybrid_shard --rdzv="$dir/hybrid_rdzv" --metrics_out="$dir/gloo_hybrid.jsonl" \
    > "$dir/gloo_hybrid_$node.log" 2>&1 &
  pids[$node]=$!
done
for node in 0 1; do
  wait "${pids[$node]}" || { echo "gloo hybrid_shard run failed:"; cat "$dir"/gloo_hybrid_*.log; exit 1; }
done
grep -q "FSDP HYBRID_SHARD" "$dir/gloo_hybrid_0.log"
# The shared --rdzv folder keeps nothing of a run that ended well.
[[ -d "$dir/hybrid_rdzv" && -z "$(ls -A "$dir/hybrid_rdzv")" ]] ||
  { echo "keys left in the --rdzv folder:"; ls -A "$dir/hybrid_rdzv"; exit 1; }
same_losses "$dir/threads_hybrid.jsonl" "$dir/gloo_hybrid.jsonl" "hybrid_shard"
echo "gloo hybrid_shard (2 nodes x 2 ranks): losses equal the threads engine's"

# bf16 mixed precision with DDP and ZeRO-1: gloo equals threads too.
for strategy in ddp zero1; do
  "$train" "${common[@]}" --world_size=2 --strategy=$strategy --precision=bf16 \
    --metrics_out="$dir/threads_bf16_$strategy.jsonl" > "$dir/threads_bf16_$strategy.log"
  "$launch" --nproc_per_node=2 --rdzv_endpoint=127.0.0.1:29535 -- \
    "$train" "${common[@]}" --backend=gloo --strategy=$strategy --precision=bf16 \
    --metrics_out="$dir/gloo_bf16_$strategy.jsonl" > "$dir/gloo_bf16_$strategy.log" 2>&1 ||
    { echo "gloo bf16 $strategy run failed:"; cat "$dir/gloo_bf16_$strategy.log"; exit 1; }
  same_losses "$dir/threads_bf16_$strategy.jsonl" "$dir/gloo_bf16_$strategy.jsonl" "bf16 $strategy"
  echo "gloo bf16 $strategy: losses equal the threads engine's"
done

# FSDP shards: each rank holds half of the optimizer state DDP holds.
optim() { grep "^\[rank 1\] peak memory" "$1" | sed -E 's/.* optim ([0-9.]+) .*/\1/'; }
awk -v f="$(optim "$dir/gloo_full_shard.log")" -v d="$(optim "$dir/gloo_ddp.log")" \
  'BEGIN { r = f / d; if (r < 0.45 || r > 0.55) { print "optim full_shard/ddp " r; exit 1 } }'

# A restart meets under fresh keys: in attempt 0 rank 1 dies before the
# rendezvous (rank 0 has written its keys and is stopped); attempt 1 trains.
marker="$dir/failed_once"
"$launch" --nproc_per_node=2 --max_restarts=1 --grace_period_s=1 --rdzv_endpoint=127.0.0.1:29531 -- \
  sh -c 'if [ "$RANK" = 1 ] && [ ! -e "$0" ]; then sleep 1; touch "$0"; exit 3; fi; exec "$@"' \
  "$marker" "$train" "${common[@]}" --backend=gloo --strategy=full_shard \
  --metrics_out="$dir/restarted.jsonl" > "$dir/restarted.log" 2>&1 ||
  { echo "restarted run failed:"; cat "$dir/restarted.log"; exit 1; }
grep -q "restarting all 2 workers (restart 1 of 1)" "$dir/restarted.log"
same_losses "$dir/threads_full_shard.jsonl" "$dir/restarted.jsonl" "restarted"
# The default directory (this user's) was used, and the run's folder in it,
# with the keys both attempts left, removed when the run ended well.
[[ -d "$TMPDIR/fsdp_rdzv_u$(id -u)_127.0.0.1_29531" ]]
[[ -z "$(ls -A "$TMPDIR/fsdp_rdzv_u$(id -u)_127.0.0.1_29531")" ]] ||
  { echo "run folders left:"; ls "$TMPDIR/fsdp_rdzv_u$(id -u)_127.0.0.1_29531"; exit 1; }
echo "a restarted job rendezvouses again and trains the same losses"

# Through a Redis store: the same losses, and the run's keys removed when it
# ends well (a server many jobs share keeps none of them).
if [[ -x /usr/bin/redis-server && -x /usr/bin/redis-cli ]]; then
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
  /usr/bin/redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    > "$dir/redis.log" 2>&1 &
  redis_pid=$!
  trap 'kill $redis_pid 2> /dev/null || true' EXIT
  for _ in $(seq 100); do
    /usr/bin/redis-cli -p "$port" ping > /dev/null 2>&1 && break
    sleep 0.1
  done
  /usr/bin/redis-cli -p "$port" set other/job/key 1 > /dev/null  # another job's: stays
  "$launch" --nproc_per_node=2 --rdzv_endpoint=127.0.0.1:29537 --rdzv_id=redis_job -- \
    "$train" "${common[@]}" --backend=gloo --strategy=full_shard --rdzv="redis://127.0.0.1:$port" \
    --metrics_out="$dir/redis.jsonl" > "$dir/redis_run.log" 2>&1 ||
    { echo "the Redis run failed:"; cat "$dir/redis_run.log"; exit 1; }
  same_losses "$dir/threads_full_shard.jsonl" "$dir/redis.jsonl" "through Redis"
  keys=$(/usr/bin/redis-cli -p "$port" --scan | sort | tr '\n' ' ')
  [[ $keys == "other/job/key " ]] || { echo "keys left in Redis: $keys"; exit 1; }
  kill $redis_pid
  echo "through Redis: the same losses, and the run's keys removed"
fi

# A job restarted after its checkpoint continues from it with --resume=auto
# (the flag its first attempt had too, which then starts fresh): attempt 0
# trains 2 of the 4 steps, saves and exits 3 on both ranks; attempt 1
# resumes at step 2 and the 4 steps' losses are the uninterrupted run's.
marker="$dir/stopped_once"
"$launch" --nproc_per_node=2 --max_restarts=1 --grace_period_s=1 --rdzv_endpoint=127.0.0.1:29531 -- \
  sh -c 'if [ ! -e "$0.$RANK" ]; then touch "$0.$RANK"; "$@" --steps=2 || exit 1; exit 3; fi
         exec "$@"' \
  "$marker" "$train" "${common[@]}" --backend=gloo --strategy=full_shard \
  --checkpoint_dir="$dir/restart_ck" --resume=auto --metrics_out="$dir/auto.jsonl" \
  > "$dir/auto.log" 2>&1 || { echo "restarted run failed:"; cat "$dir/auto.log"; exit 1; }
grep -q "restarting all 2 workers (restart 1 of 1)" "$dir/auto.log"
grep -q -- "--resume=auto: no checkpoint in $dir/restart_ck yet: starting from step 0" \
  "$dir/auto.log"
grep -q "resumed from $dir/restart_ck/step_000002 at step 2" "$dir/auto.log"
same_losses "$dir/threads_full_shard.jsonl" "$dir/auto.jsonl" "restarted with --resume=auto"
echo "a job restarted after a checkpoint resumes it (--resume=auto)"

# --init_from reads only each process's FSDP shard, slice by slice, of a
# one-process checkpoint, its Hugging Face export (Conv1D weights read
# transposed) and a sharded checkpoint (world 2), so a process's peak memory
# (its ledger) is a fresh model's: reading the files whole showed 10.65 MiB of
# temporaries for gpt-mini here, against 0.70. With lr 0 the first step's loss
# is the threads engine's from the same checkpoint, and all three give it.
mini=(--data=shipped --seq_len=32 --batch_size=2 --steps=1 --timeout_s=120)
"$train" --preset=gpt-mini "${mini[@]}" --checkpoint_dir="$dir/mini" > /dev/null
"$train" "${mini[@]}" --lr=0 --init_from="$dir/mini" --world_size=2 \
  --strategy=full_shard --checkpoint_dir="$dir/mini_sharded" > /dev/null
"$checkpoint" export-hf "$dir/mini" "$dir/mini_hf" > /dev/null
"$launch" --nproc_per_node=2 --rdzv_endpoint=127.0.0.1:29531 -- \
  "$train" "${mini[@]}" --preset=gpt-mini --lr=0 --backend=gloo --strategy=full_shard \
  --metrics_out="$dir/mini_fresh.jsonl" > "$dir/mini_fresh.log" 2>&1 ||
  { echo "gloo fresh run failed:"; cat "$dir/mini_fresh.log"; exit 1; }
"$train" "${mini[@]}" --init_from="$dir/mini" --lr=0 --world_size=2 --strategy=full_shard \
  --metrics_out="$dir/mini_threads.jsonl" > /dev/null
# Each rank's parameters and temporaries peaks (the total's moment varies with
# the ranks' timing).
peaks() {
  grep -o "peak memory of rank [01] by category.*" "$1" | sort |
    awk '{ for (i = 1; i <= NF; ++i) if ($i == "params" || $i == "temp") printf "%s %s ", $i, $(i + 1); print $5 }'
}
[[ $(peaks "$dir/mini_fresh.log" | wc -l) == 2 ]]
for init in mini mini_hf mini_sharded/step_000001; do
  run="$dir/init_${init%%/*}"
  "$launch" --nproc_per_node=2 --rdzv_endpoint=127.0.0.1:29531 -- \
    "$train" "${mini[@]}" --init_from="$dir/$init" --lr=0 --backend=gloo --strategy=full_shard \
    --metrics_out="$run.jsonl" > "$run.log" 2>&1 ||
    { echo "gloo --init_from=$init run failed:"; cat "$run.log"; exit 1; }
  [[ $(peaks "$run.log") == $(peaks "$dir/mini_fresh.log") ]] ||
    { echo "per-process peaks with --init_from=$init:"; peaks "$run.log"; echo "fresh:";
      peaks "$dir/mini_fresh.log"; exit 1; }
  [[ $(losses "$dir/mini_threads.jsonl") == $(losses "$run.jsonl") ]] ||
    { echo "--init_from=$init: loss $(losses "$run.jsonl") vs threads $(losses "$dir/mini_threads.jsonl")"; exit 1; }
done
grep -q "^\[rank 0\] init_from: checkpoint $dir/mini/step_000001 (step 1)" "$dir/init_mini.log"
grep -q "^\[rank 0\] init_from: Hugging Face GPT-2 $dir/mini_hf" "$dir/init_mini_hf.log"
grep -q "^\[rank 0\] init_from: checkpoint $dir/mini_sharded/step_000001 (step 1)" "$dir/init_mini_sharded.log"
echo "gloo --init_from a checkpoint, its HF export, a sharded checkpoint: each process reads its shard only, peaks as a fresh model's; step, loss $(losses "$dir/mini_threads.jsonl") as the threads engine's"

# Errors: exit code 2, a message naming what is wrong.
quick=(--preset=gpt-nano --data=random --steps=1 --batch_size=2 --seq_len=32)

# Workers started as torchrun without --rdzv-id starts them (run id "none",
# the same for every job): a second job on the same port meets as the first
# did, whose keys went with it.
for job in 1 2; do
  for r in 0 1; do
    env -u RUN_ID -u RESTART_COUNT WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 RANK=$r LOCAL_RANK=$r \
      MASTER_ADDR=127.0.0.1 MASTER_PORT=29537 TORCHELASTIC_RUN_ID=none \
      TORCHELASTIC_RESTART_COUNT=0 "$train" "${quick[@]}" --backend=gloo --timeout_s=60 \
      > "$dir/none_${job}_$r.log" 2>&1 &
  done
  for r in 0 1; do
    wait -n || { echo "torchrun-like job $job failed:"; cat "$dir/none_${job}"_*.log; exit 1; }
  done
done
[[ -z "$(ls -A "$TMPDIR/fsdp_rdzv_u$(id -u)_127.0.0.1_29537")" ]]
echo "two torchrun-like jobs (run id none) on one port: both train, no keys left"
exits_2 "--rdzv='tcp://127.0.0.1:29800': the ranks meet in a directory" \
  env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 RUN_ID=x \
  "$train" "${quick[@]}" --backend=gloo --rdzv=tcp://127.0.0.1:29800
touch "$dir/a_file"
exits_2 "the rendezvous store '$dir/a_file' is not a folder this process can write (Not a dir" \
  env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 RUN_ID=x \
  "$train" "${quick[@]}" --backend=gloo --rdzv="$dir/a_file"
exits_2 "RANK is not set" env -u RANK WORLD_SIZE=2 "$train" "${quick[@]}" --backend=gloo
exits_2 "WORLD_SIZE='x' is not an integer" \
  env RANK=0 WORLD_SIZE=x "$train" "${quick[@]}" --backend=gloo
exits_2 "RANK='2' is not an integer in [0, 1]" \
  env RANK=2 WORLD_SIZE=2 "$train" "${quick[@]}" --backend=gloo
exits_2 "--world_size=4 disagrees with WORLD_SIZE=2" \
  env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 RUN_ID=x \
  "$train" "${quick[@]}" --backend=gloo --world_size=4
exits_2 "needs MASTER_ADDR, MASTER_PORT, RUN_ID" \
  env -u MASTER_ADDR -u MASTER_PORT -u RUN_ID RANK=0 WORLD_SIZE=2 \
  "$train" "${quick[@]}" --backend=gloo
exits_2 "--backend=nccl needs --device=cuda" "$train" "${quick[@]}" --backend=nccl
exits_2 "--cpu_offload keeps FSDP's shards, gradients and optimizer state in host memory" \
  "$train" "${quick[@]}" --world_size=2 --cpu_offload
exits_2 "--device=cuda: this binary was built without CUDA" \
  "$train" "${quick[@]}" --world_size=2 --device=cuda
exits_2 "--backend='mpi' is not one of threads, gloo, nccl" \
  "$train" "${quick[@]}" --backend=mpi
exits_2 "--strategy=hybrid_shard with --backend=threads needs --hybrid_shard_group_size" \
  "$train" "${quick[@]}" --world_size=2 --strategy=hybrid_shard
exits_2 "--auto_wrap='size:0': size:N needs a whole number N >= 1" \
  "$train" "${quick[@]}" --world_size=2 --auto_wrap=size:0
exits_2 "--world_size=-1 must be >= 1" "$train" "${quick[@]}" --world_size=-1
exits_2 "--timeout_s=0 must be in" "$train" "${quick[@]}" --world_size=2 --timeout_s=0
# size:N trains (threads): gpt-nano's blocks and embeddings become units.
"$train" "${quick[@]}" --world_size=2 --auto_wrap=size:100000 > "$dir/size.log"
grep -Eq "FSDP FULL_SHARD, [0-9]+ units \(auto_wrap size:100000\)" "$dir/size.log"
echo PASS
