#!/usr/bin/env bash
# //models/t5:train under data parallelism: two ranks of FSDP FULL_SHARD
# (T5Block units, the shared embedding in the root unit) train the losses of
# one process on the global batch (dropout 0, within 1e-5), as threads and as
# two gloo processes started by //tools:launch (equal to the threads engine).
# A wrap policy that would move the shared embedding out of the root unit is
# refused (exit 2).
set -euo pipefail
# The same thread counts in the launched workers as in the one-process runs
# they are compared with (the launcher would give each its share of the
# cores, and bf16 GEMMs round differently with another OpenMP team size).
export FSDP_NUM_THREADS=2 OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2
launch="$1"
train="$2"
dir="${TEST_TMPDIR}/t5_gloo"
mkdir -p "$dir/tmp"
export TMPDIR="$dir/tmp"

common=(--steps=4 --encoder_length=32 --dropout=0 --log_every=1 --timeout_s=120)
losses() { sed -E 's/.*"step":([0-9]+),"loss":([0-9.]+).*/\1 \2/' "$1"; }
compare() {  # compare A B TOLERANCE NAME
  [[ $(losses "$2" | wc -l) == 4 ]] || { echo "$4: expected 4 steps"; cat "$2"; exit 1; }
  paste -d' ' <(losses "$1") <(losses "$2") |
    awk -v s="$4" -v tol="$3" '{ d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > tol) {
      print s ": step " $1 " loss " $2 " vs " $4; bad = 1 } } END { exit bad }'
}

"$train" "${common[@]}" --batch_size=4 --metrics_out="$dir/one.jsonl" > "$dir/one.log"
"$train" "${common[@]}" --batch_size=2 --world_size=2 --strategy=full_shard \
  --metrics_out="$dir/threads.jsonl" > "$dir/threads.log"
grep -q "FSDP FULL_SHARD, 5 units (auto_wrap transformer)" "$dir/threads.log"
compare "$dir/one.jsonl" "$dir/threads.jsonl" 1e-5 "threads vs one process"
"$launch" --nproc_per_node=2 -- "$train" "${common[@]}" --batch_size=2 --backend=gloo \
  --strategy=full_shard --metrics_out="$dir/gloo.jsonl" > "$dir/gloo.log" 2>&1 ||
  { cat "$dir/gloo.log"; exit 1; }
cat "$dir/gloo.log"
compare "$dir/threads.jsonl" "$dir/gloo.jsonl" 2e-6 "gloo vs threads"
grep -q "^\[rank 1\] peak memory of rank 1 by category (MiB, ledger): params" "$dir/gloo.log"
echo "T5 FULL_SHARD over 2 ranks (threads and gloo) trains the losses of one process"

# A sharded checkpoint at world 2 (steps 1-2) resumes at world 1 under ZeRO-1
# (batch 4): steps 3-4 have the losses of the uninterrupted runs.
"$train" "${common[@]}" --steps=2 --batch_size=2 --world_size=2 --strategy=full_shard \
  --checkpoint_dir="$dir/ck" > "$dir/first.log"
"$train" "${common[@]}" --batch_size=4 --world_size=1 --strategy=zero1 --checkpoint_dir="$dir/ck" \
  --resume=latest --metrics_out="$dir/resumed.jsonl" > "$dir/resumed.log"
grep -q "resumed from $dir/ck/step_000002 at step 2" "$dir/resumed.log"
paste -d' ' <(losses "$dir/threads.jsonl" | tail -2) <(losses "$dir/resumed.jsonl") |
  awk '{ d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 1e-5) { print "resume: " $0; bad = 1 } }
       END { exit bad }'
echo "T5 sharded checkpoint: world 2 FULL_SHARD -> world 1 ZeRO-1 continues with the same losses"

set +e
"$train" "${common[@]}" --world_size=2 --auto_wrap=size:1000 2> "$dir/err.txt"; code=$?
set -e
cat "$dir/err.txt"
[[ $code == 2 ]] && grep -q "puts 'shared.weight' into the FSDP unit 'shared', but it must stay in the root unit" "$dir/err.txt" ||
  { echo "expected exit 2 and puts shared.weight into the FSDP unit shared, but it must st; got $code:"; cat "$dir/err.txt"; exit 1; }
echo PASS
