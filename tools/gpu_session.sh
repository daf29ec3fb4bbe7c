#!/usr/bin/env bash
# The checks and benchmarks of issue 5 on a lent GPU machine, in few device calls: run in the
# repository root there (the device tool copies the working tree), with the bundle made here
# by tools/gpu_bundle.sh and carried as gpu_bundle.tar.xz. Every phase writes a short summary
# to stdout and its full logs under $OUT (at most 8 files come back; each phase writes <= 3).
#
#   tools/gpu_session.sh first   what issue 5 needs most, in one call, for a session with little
#                                device time: every bundled test (GPU_SESSION_FIRST_TESTS names
#                                others; each killed after 120 s, none started after 150 s; on
#                                the H200 all took 45 s), then the pytorch phase (started before
#                                300 s, killed at 400 s), the attention phase (started before
#                                420 s, killed at 445 s), matmul_benchmark's LM head rows in bf16
#                                (started before 450 s, killed at 470 s) and the profile phase
#                                (started before 480 s, killed at 580 s). GPU_SESSION_<PART>_BY_S
#                                (PYTORCH, ATTENTION, BENCH, PROFILE) move the start limits,
#                                GPU_SESSION_PYTORCH_UNTIL_S and GPU_SESSION_PROFILE_UNTIL_S
#                                the kills, for a call that runs more. What does not start is
#                                named NOT RUN. $OUT: tests.txt, tests.log, vs_pytorch.json,
#                                attention.txt, matmul.txt, ncu.csv, profile.txt, profile.json
#                                (the 8 files the device tool brings back; chart
#                                vs_pytorch.json here with tools/plot.py)
#   tools/gpu_session.sh tests [NAME...]
#                                every bundled *_test (or the NAMEd ones): PASS / FAIL per
#                                binary with its ok / skipped / failed counts, the tail of each
#                                failure ($OUT/tests.txt, $OUT/tests.log). A binary still running
#                                after GPU_SESSION_TEST_TIMEOUT_S (240) is killed and FAILs
#                                (exit 124); none starts after GPU_SESSION_DEADLINE_S (540) of
#                                the phase, so one call ends inside the device tool's 600 s with
#                                its summary: the ones left are listed as NOT RUN, to pass by name
#                                to a second call.
#   tools/gpu_session.sh bench   //tensor/cuda:matmul_benchmark (also with FSDP_CUDA_GEMM_TUNE=1),
#                                :attention_benchmark, :norm_benchmark and :loss_benchmark
#                                (tables; $OUT/matmul.txt, $OUT/matmul_tuned.txt,
#                                $OUT/attention.txt, $OUT/norm.txt, $OUT/loss.txt)
#   tools/gpu_session.sh train   minGPT on the GPU: one process, FSDP FULL_SHARD over 2 ranks
#                                sharing it (threads), the same with --cpu_offload, and DDP;
#                                NO_SHARD offloaded, HYBRID_SHARD (4 ranks) and offloaded;
#                                losses and per-rank memory ($OUT/train.log), sampling from
#                                the first run's checkpoint with and without the key/value
#                                cache (the same tokens? tokens/s), the runs' losses
#                                and tokens/s charted by tools/plot.py ($OUT/train.svg)
#   tools/gpu_session.sh pytorch gpt2 124M bf16, batch 16 x 1024, AdamW: tokens/s and MFU of
#                                ours (also with FSDP_CUDA_GEMM_TUNE=1, with
#                                FSDP_CUDA_BIAS_GRAD_EPILOGUE=0, FSDP_CUDA_DGELU_BIAS_GRAD=1,
#                                with FSDP_CUDA_NORM_HOLD_ROWS=0,
#                                with FSDP_CUDA_LOSS_ROW_THREADS=256, and with
#                                FSDP_CUDA_ATTENTION=cudnn, alone and with the tuning;
#                                GPU_SESSION_PYTORCH_VARIANTS: other flags) and of PyTorch eager
#                                ($OUT/vs_pytorch.json, charted in $OUT/vs_pytorch.svg)
#   tools/gpu_session.sh attention
#                                //tensor/cuda:attention_benchmark 8 20 and PyTorch's
#                                scaled_dot_product_attention (flash, cudnn, efficient backends)
#                                at its shapes, one table (tools/attention_vs_torch.py;
#                                $OUT/attention.txt, $OUT/attention_vs_torch.json)
#   tools/gpu_session.sh cudnn   cuDNN's fused attention (FSDP_CUDA_ATTENTION=cudnn), first run
#                                and its figures in one call: attention_cudnn_test under
#                                cuDNN's API log (level 3: every backend call and attribute),
#                                DGELU_BGRAD's bias gradient against the CPU (linear_test,
#                                model_cuda_test, one case each),
#                                gpt2 trained 4 steps with our attention and with cuDNN's (the
#                                losses side by side), then attention_benchmark 1 1 and PyTorch's
#                                own cuDNN SDPA (forward and backward, B 1, T 1024 and 2048) each
#                                under the API log (to diff the two graphs here with
#                                tools/cudnn_log_graph.py when ours fails), then the attention
#                                phase, norm_benchmark ($OUT/norm.txt), loss_benchmark
#                                ($OUT/loss.txt), matmul_benchmark --epilogues_only
#                                ($OUT/matmul.txt: the DGELU_BGRAD pair last) and the pytorch
#                                phase (GPU_SESSION_CUDNN_PYTORCH_UNTIL_S, 560) with the cuDNN
#                                variants (alone, with the GEMM tuning, and with the tuning and
#                                FSDP_CUDA_DGELU_BIAS_GRAD=1), the tuning, c_fc's bias gradient
#                                and the column sums without it, and the norms loading their
#                                rows (FSDP_CUDA_NORM_HOLD_ROWS=0). $OUT: tests.txt, tests.log,
#                                cudnn_logs.tar.xz (ours, PyTorch's), attention.txt, norm.txt,
#                                loss.txt, matmul.txt, vs_pytorch.json
#   tools/gpu_session.sh profile where a gpt2 bf16 training step's GPU time goes, per kernel
#                                (Nsight Compute's durations of about one steady step's
#                                kernels: GPU_SESSION_PROFILE_KERNELS (700) after the first
#                                GPU_SESSION_PROFILE_SKIP (700); tools/ncu_summary.py;
#                                $OUT/profile.txt, $OUT/profile.json, $OUT/ncu.csv)
#   tools/gpu_session.sh kernels Nsight Compute's sections (speed of light, compute and memory
#                                workload, warp states, launch, occupancy) of the fused
#                                attention's three tensor-core kernels, forward, dk/dv and dq,
#                                at attention_benchmark's B 8, T 1024 ($OUT/kernels_ncu.txt;
#                                their throughputs, busiest pipes and occupancy to stdout);
#                                with FSDP_CUDA_ATTENTION_DKDV=narrow FSDP_CUDA_ATTENTION_DQ=narrow
#                                in the environment, the narrow dk/dv and dq kernels instead
#                                (the benchmark's first backward runs as the environment says)
#   tools/gpu_session.sh racecheck
#                                compute-sanitizer's racecheck (shared-memory hazards) and
#                                synccheck on the kernel tests with the most synchronization,
#                                at their smaller cases: the hardware's word on what
#                                --config=cuda_emu_race checks on the emulation
#                                ($OUT/racecheck.txt, $OUT/racecheck.log); GPU_SESSION_RACECHECKS
#                                ("tool test gtest_filter" per line) runs others
#   tools/gpu_session.sh memory  //tools:bench_memory over GPU memory: per-rank peaks of DDP,
#                                ZeRO-1, SHARD_GRAD_OP, FULL_SHARD (+wrap), ranks sharing
#                                cuda:0, and the ZeRO formula checks ($OUT/memory.json,
#                                charted in $OUT/memory.svg)
#
# Device tool: carry ["gpu_bundle.tar.xz"]; command
#   tar xJf gpu_bundle.tar.xz && tools/gpu_session.sh first   (then tests, bench, train, ...)
# (the bundle unpacks to gpu_bundle/; GPU_SESSION_BUNDLE names another folder).
set -uo pipefail

phase=${1:-}
case "$phase" in
  first|tests|bench|train|pytorch|attention|cudnn|profile|kernels|racecheck|memory) ;;
  *) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bundle=${GPU_SESSION_BUNDLE:-gpu_bundle}
out=${OUT:-/tmp/gpu_session_out}
mkdir -p "$out"
run=$bundle/run.sh
[[ -x "$run" ]] || { echo "gpu_session: no $run (unpack gpu_bundle.tar.xz first)" >&2; exit 2; }
has() { [[ -x "$bundle/bin/$1" ]]; }
# NCCL's own warnings (why an init or a collective failed) into the tests' logs; a machine with
# a small /dev/shm may also need NCCL_SHM_DISABLE=1.
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

# The phases that run many checks (tests, racecheck): none starts after the phase's deadline,
# each is killed after the per-check timeout.
deadline=$(( $(date +%s) + ${GPU_SESSION_DEADLINE_S:-540} ))
per_check=${GPU_SESSION_TEST_TIMEOUT_S:-240}
failed=0
past_deadline() { (( $(date +%s) >= deadline )); }
# timed_check CMD...: runs CMD with its output in $out/check.tmp; sets code, secs and verdict.
timed_check() {
  local start
  start=$(date +%s)
  timeout -k 10 "$per_check" "$@" > "$out/check.tmp" 2>&1
  code=$?
  secs=$(( $(date +%s) - start ))
  if (( code == 0 )); then verdict=PASS; else verdict=FAIL; failed=$((failed + 1)); fi
}
# record_check NAME LINE GREP_ARGS...: LINE (and a note when the check was killed) to stdout and
# $out/NAME.txt, the whole output to $out/NAME.log, and on failure the lines GREP_ARGS select.
record_check() {
  local name=$1 line=$2
  shift 2
  (( code == 124 || code == 137 )) && line+=" (killed: still running after ${per_check}s)"
  echo "$line" | tee -a "$out/$name.txt"
  { echo "=== $line"; cat "$out/check.tmp"; } >> "$out/$name.log"
  if (( code != 0 )); then grep "$@" "$out/check.tmp" | head -60 >> "$out/$name.txt"; fi
  rm -f "$out/check.tmp"
}

# run_tests NAME...: each bundled test binary (PASS / FAIL with its gtest counts) into
# $out/tests.txt and $out/tests.log; none starts after the deadline (NOT RUN).
run_tests() {
  : > "$out/tests.log"
  : > "$out/tests.txt"
  local t passed skipped failures not_run=()
  for t in "$@"; do
    if past_deadline; then
      not_run+=("$t")
      continue
    fi
    timed_check "$run" "$t"
    passed=$(grep -c '^\[       OK \]' "$out/check.tmp")
    skipped=$(grep -c '^\[  SKIPPED \]' "$out/check.tmp")
    failures=$(grep -c '^\[  FAILED  \]' "$out/check.tmp")
    record_check tests "$verdict $t (exit $code, ${secs}s): $passed ok, $skipped skipped, $failures failed" \
      -B2 -A12 -m 5 -E 'Failure|FAILED|error|Error'
  done
  if (( ${#not_run[@]} > 0 )); then
    echo "NOT RUN (the phase's deadline passed): ${not_run[*]}" | tee -a "$out/tests.txt"
  fi
  echo "failed binaries: $failed" | tee -a "$out/tests.txt"
}

# The variants of ours the pytorch phase times beside the default: the GEMM tuning, the
# column-sum bias gradients, c_fc's bias gradient out of DGELU_BGRAD, cuDNN's attention, cuDNN's attention with the tuning, the
# norm kernels loading their rows in each pass (FSDP_CUDA_NORM_HOLD_ROWS=0), and the loss's rows of 256 threads.
# (--attention_dq_atomic and --attention_narrow, timed on 2026-11-27: 39.6% and 41.5% MFU
# against 41.0%, the narrow kernels x1.01 in attention_benchmark; GPU_SESSION_PYTORCH_VARIANTS
# replaces the list.)
read -r -a pytorch_variants <<< "${GPU_SESSION_PYTORCH_VARIANTS:---gemm_tune --bias_grad_unfused --dgelu_bias_grad --attention_cudnn --ours_env cudnn_tuned:FSDP_CUDA_ATTENTION=cudnn,FSDP_CUDA_GEMM_TUNE=1 --ours_env norms_loaded:FSDP_CUDA_NORM_HOLD_ROWS=0 --ours_env loss_rows_256:FSDP_CUDA_LOSS_ROW_THREADS=256}"

# run_pytorch LIMIT_S [FLAG...]: gpt2 124M bf16, batch 16 x 1024, AdamW, ours against PyTorch
# eager (with its fused attention too) through tools/bench_vs_pytorch.py, FLAGs added, killed
# after LIMIT_S seconds; $out/vs_pytorch.json and its chart.
run_pytorch() {
  local limit=$1
  shift
  PYTHONUNBUFFERED=1 timeout -k 10 "$limit" python3 tools/bench_vs_pytorch.py --device cuda --preset gpt2 \
    --seq_len 1024 --batch_size 16 --optimizer adamw --steps 8 --warmup 2 --torch_sdpa "$@" \
    --train_cmd "$run train" --json_out "$out/vs_pytorch.json"
  local rc=$?
  [[ -s "$out/vs_pytorch.json" ]] && python3 tools/plot.py speed "$out/vs_pytorch.json" --out "$out/vs_pytorch.svg"
  return $rc
}

# run_matmul_bench LIMIT_S [FLAG...]: //tensor/cuda:matmul_benchmark's table (ours against the
# raw cuBLASLt call) into $out/matmul.txt, killed after LIMIT_S seconds.
run_matmul_bench() {
  local limit=$1
  shift
  timeout -k 5 "$limit" "$run" matmul_benchmark --samples=20 --reps=10 "$@" 2>&1 |
    tee "$out/matmul.txt" | tail -40
}

# run_attention LIMIT_S [FLAG...]: attention_benchmark (B 8, 20 iterations) and PyTorch's SDPA
# backends at its shapes, side by side (tools/attention_vs_torch.py, FLAGs added), killed after
# LIMIT_S seconds; $out/attention.txt.
run_attention() {
  local limit=$1
  shift
  PYTHONUNBUFFERED=1 timeout -k 5 "$limit" python3 "$here/attention_vs_torch.py" \
    --ours_cmd "$run attention_benchmark" --batch 8 --iters 20 "$@" > "$out/attention.txt" 2>&1
  local rc=$?
  sed -n '/^fused causal attention/,$p' "$out/attention.txt"
  (( rc == 0 )) || { echo "attention: exit $rc (124: killed after $limit s); the end of its log:"; tail -5 "$out/attention.txt"; }
  return $rc
}

# run_row_bench NAME LIMIT_S ARG...: //tensor/cuda:NAME_benchmark ARGs (its table, then a JSON
# line) into $out/NAME.txt, killed after LIMIT_S seconds: norm (gpt2's LayerNorm, T5's
# RMSNorm: rows held in registers against rows loaded by each pass) and loss (gpt2's fused
# cross-entropy with each row block size), alternating rounds.
run_row_bench() {
  local name=$1 limit=$2
  shift 2
  if ! has "${name}_benchmark"; then
    echo "SKIP $name (${name}_benchmark is not in the bundle)"
    return 0
  fi
  timeout -k 5 "$limit" "$run" "${name}_benchmark" "$@" > "$out/$name.txt" 2>&1
  local rc=$?
  grep -v '^{' "$out/$name.txt"
  (( rc == 0 )) || echo "$name: exit $rc (124: killed after $limit s)"
  return $rc
}

find_ncu() {
  command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1
}

# run_profile LIMIT_S: GPU_SESSION_PROFILE_KERNELS (700) kernels of three gpt2 bf16 steps,
# after the first GPU_SESSION_PROFILE_SKIP (700: the initialization and most of step 1; a
# steady step launches about 630, 50 a block, as //models/mingpt:gpu_step_counts_test counts
# on the emulation), under Nsight Compute (killed after LIMIT_S seconds), summarized per
# kernel into $out/profile.txt and $out/profile.json; $out/ncu.csv holds ncu's rows, and the
# end of its log goes to profile.txt. ncu starts the train binary itself (run.sh prints the
# command, GPU_BUNDLE_PRINT_COMMAND: env, then the loader that runs the binary) with
# --target-processes all: on the H200, application-only profiled no kernel (ncu seems to
# count the exec'd loader as a child), and with no --launch-count, run through run.sh, it
# was still running after 200 s.
run_profile() {
  local ncu rc cmd
  ncu=$(find_ncu)
  mapfile -t cmd < <(GPU_BUNDLE_PRINT_COMMAND=1 "$run" train --device=cuda:0 --preset=gpt2 \
    --precision=bf16 --batch_size=${GPU_SESSION_BATCH:-16} --seq_len=1024 --steps=3 \
    --data=random --dropout=0 --optimizer=adamw --log_every=1)
  (( ${#cmd[@]} > 0 )) || { echo "profile: run.sh printed no command"; return 1; }
  timeout -k 10 "$1" "$ncu" --clock-control none --cache-control none \
    --target-processes all --metrics gpu__time_duration.sum \
    --launch-skip "${GPU_SESSION_PROFILE_SKIP:-700}" \
    --launch-count "${GPU_SESSION_PROFILE_KERNELS:-700}" \
    --csv --page raw "${cmd[@]}" > "$out/ncu.csv" 2> "$out/ncu.err"
  rc=$?
  python3 "$here/ncu_summary.py" "$out/ncu.csv" --top 30 --json_out "$out/profile.json" |
    tee "$out/profile.txt"
  { echo "ncu exit $rc (124: killed after $1 s); the end of its log:"; tail -5 "$out/ncu.err"; } |
    tee -a "$out/profile.txt"
  rm -f "$out/ncu.err"
}

# started_before SECONDS: the phase began less than SECONDS ago.
phase_start=$(date +%s)
started_before() { (( $(date +%s) - phase_start < $1 )); }

case "$phase" in
  first)
    if [[ -n "${GPU_SESSION_FIRST_TESTS:-}" ]]; then
      mapfile -t first_tests < <(printf '%s\n' $GPU_SESSION_FIRST_TESTS)
    else  # every bundled test: on the H200 all 27 took 45 s
      mapfile -t first_tests < <("$run" --list | grep '_test$')
    fi
    present=()
    for t in "${first_tests[@]}"; do
      if has "$t"; then present+=("$t"); else echo "SKIP $t (not in the bundle)"; fi
    done
    per_check=${GPU_SESSION_TEST_TIMEOUT_S:-120}
    deadline=$(( phase_start + ${GPU_SESSION_DEADLINE_S:-150} ))
    (( ${#present[@]} > 0 )) && run_tests "${present[@]}"
    if ! has train; then
      echo "SKIP pytorch (train is not in the bundle)"
    elif ! started_before "${GPU_SESSION_PYTORCH_BY_S:-300}"; then
      echo "NOT RUN pytorch (the phase is $(( $(date +%s) - phase_start ))s old)"
    else
      echo "=== ours against PyTorch eager"
      run_pytorch $(( phase_start + ${GPU_SESSION_PYTORCH_UNTIL_S:-400} - $(date +%s) )) \
        "${pytorch_variants[@]}" || echo "pytorch: exit $? (124: killed at the phase's limit)"
    fi
    if ! has attention_benchmark; then
      echo "SKIP attention (attention_benchmark is not in the bundle)"
    elif ! started_before "${GPU_SESSION_ATTENTION_BY_S:-420}"; then
      echo "NOT RUN attention (the phase is $(( $(date +%s) - phase_start ))s old)"
    else
      echo "=== the fused attention against PyTorch's"
      run_attention $(( phase_start + 445 - $(date +%s) ))
    fi
    if ! has matmul_benchmark; then
      echo "SKIP bench (matmul_benchmark is not in the bundle)"
    elif ! started_before "${GPU_SESSION_BENCH_BY_S:-450}"; then
      echo "NOT RUN bench (the phase is $(( $(date +%s) - phase_start ))s old)"
    else
      echo "=== the LM head's GEMMs (bf16) against the raw cuBLASLt call"
      run_matmul_bench $(( phase_start + 470 - $(date +%s) )) --cases=head --dtypes=bf16 ||
        echo "bench: exit $? (124: killed at the phase's limit)"
    fi
    if ! has train || [[ -z "$(find_ncu)" ]]; then
      echo "SKIP profile (needs train in the bundle and ncu on this machine)"
    elif ! started_before "${GPU_SESSION_PROFILE_BY_S:-480}"; then
      echo "NOT RUN profile (the phase is $(( $(date +%s) - phase_start ))s old)"
    else
      echo "=== where a gpt2 bf16 step's GPU time goes (ncu)"
      run_profile $(( phase_start + ${GPU_SESSION_PROFILE_UNTIL_S:-580} - $(date +%s) ))
    fi
    rm -f "$out/vs_pytorch.svg"  # the 8 files above come back; chart vs_pytorch.json here
    ;;
  tests)
    shift
    for t in "$@"; do
      has "$t" || { echo "gpu_session: $t is not in the bundle" >&2; exit 2; }
    done
    if (( $# > 0 )); then
      run_tests "$@"
    else
      mapfile -t all < <("$run" --list | grep '_test$')
      run_tests "${all[@]}"
    fi
    ;;
  bench)
    # Both print tables (their own mains, not Google Benchmark): kept under $OUT.
    if has matmul_benchmark; then
      run_matmul_bench 300
      # "ours" tuned: the fastest of the heuristic's candidates, against the raw first one.
      FSDP_CUDA_GEMM_TUNE=1 "$run" matmul_benchmark --samples=20 --reps=10 2>&1 |
        tee "$out/matmul_tuned.txt" | tail -20
    else
      echo "gpu_session: matmul_benchmark is not in the bundle" >&2
    fi
    if has attention_benchmark; then  # B=8, 20 iterations; T = 1024 and 2048
      "$run" attention_benchmark 8 20 2>&1 | tee "$out/attention.txt" | tail -40
    else
      echo "gpu_session: attention_benchmark is not in the bundle" >&2
    fi
    run_row_bench norm 120 11 20
    run_row_bench loss 120 7 5
    ;;
  train)
    has train || { echo "gpu_session: train is not in the bundle" >&2; exit 2; }
    # The shipped text and no dropout: 2 ranks of batch 4 see one process's batch of 8, so
    # every run's losses should be the one process's (on the H200, with --data=random, the
    # ranks drew other rows than one process).
    common=(--device=cuda:0 --preset=gpt-mini --data=shipped --dropout=0 --steps=6
            --batch_size=8 --seq_len=128 --log_every=1 --seed=7)
    metrics=$(mktemp -d)  # the runs' --metrics_out, charted into one file under $OUT
    {
      echo "=== one process on cuda:0"
      "$run" train "${common[@]}" --metrics_out="$metrics/1_one.jsonl" --checkpoint_dir="$metrics/ck"
      if has sample; then  # generation from that checkpoint: cached decoding against none
        for kv in true false; do
          echo "=== sample on cuda:0, --kv_cache=$kv"
          "$run" sample --device=cuda:0 --checkpoint="$metrics/ck" --num_samples=4 \
            --max_new_tokens=120 --print=tokens --kv_cache=$kv > "$metrics/sample_$kv.txt"
        done
        cmp -s "$metrics/sample_true.txt" "$metrics/sample_false.txt" &&
          echo "sample: the same tokens with and without the cache" ||
          echo "sample: DIFFERENT tokens with and without the cache"
      fi
      echo "=== FSDP FULL_SHARD, 2 ranks sharing cuda:0 (batch 4 each)"
      "$run" train "${common[@]}" --batch_size=4 --world_size=2 --strategy=full_shard \
        --metrics_out="$metrics/2_fsdp.jsonl"
      echo "=== the same with --cpu_offload"
      "$run" train "${common[@]}" --batch_size=4 --world_size=2 --strategy=full_shard --cpu_offload \
        --metrics_out="$metrics/3_offload.jsonl"
      echo "=== DDP, 2 ranks sharing cuda:0"
      "$run" train "${common[@]}" --batch_size=4 --world_size=2 --strategy=ddp \
        --metrics_out="$metrics/4_ddp.jsonl"
      echo "=== bf16, FSDP FULL_SHARD, 2 ranks"
      "$run" train "${common[@]}" --batch_size=4 --world_size=2 --precision=bf16 \
        --metrics_out="$metrics/5_fsdp_bf16.jsonl"
      # Written 2026-12-01 without a GPU: NO_SHARD's offloaded uploads queued on
      # the rank's stream, HYBRID_SHARD's replicas' all-reduce on an idle stream.
      echo "=== NO_SHARD with --cpu_offload, 2 ranks"
      "$run" train "${common[@]}" --batch_size=4 --world_size=2 --strategy=no_shard --cpu_offload \
        --metrics_out="$metrics/6_no_shard_offload.jsonl"
      echo "=== HYBRID_SHARD, 4 ranks (2 groups of 2), and with --cpu_offload"
      "$run" train "${common[@]}" --batch_size=2 --world_size=4 --strategy=hybrid_shard \
        --hybrid_shard_group_size=2 --metrics_out="$metrics/7_hybrid.jsonl"
      "$run" train "${common[@]}" --batch_size=2 --world_size=4 --strategy=hybrid_shard \
        --hybrid_shard_group_size=2 --cpu_offload --metrics_out="$metrics/8_hybrid_offload.jsonl"
    } > "$out/train.log" 2>&1
    grep -E '^===|step +6|error|per-rank|^[0-9] |^generated|^sample:|^losses of' "$out/train.log" |
      head -90
    # Each run's largest loss difference from the one process's, over the steps.
    python3 - "$metrics"/*.jsonl <<'PY' | tee -a "$out/train.log"
import json, os, sys
def losses(path):
    with open(path) as f:
        return [json.loads(line)["loss"] for line in f if line.strip()]
paths = sorted(sys.argv[1:])
if paths and os.path.basename(paths[0]).startswith("1_"):
    ref = losses(paths[0])
    for p in paths[1:]:
        got = losses(p)
        diff = max((abs(a - b) for a, b in zip(got, ref)), default=float("nan"))
        print(f"losses of {os.path.basename(p)[2:-6]} against one process: {len(got)} steps, "
              f"max |diff| {diff:.3g}")
PY
    mapfile -t runs < <(ls "$metrics"/*.jsonl 2> /dev/null)
    if (( ${#runs[@]} > 0 )); then
      labels=$(printf '%s\n' "${runs[@]}" | sed -E 's|.*/[0-9]_(.*)\.jsonl|\1|' | paste -sd,)
      python3 tools/plot.py loss "${runs[@]}" --labels "$labels" --out "$out/train.svg"
    fi
    rm -rf "$metrics"
    ;;
  pytorch)
    has train || { echo "gpu_session: train is not in the bundle" >&2; exit 2; }
    run_pytorch 590 "${pytorch_variants[@]}"
    ;;
  attention)
    has attention_benchmark || { echo "gpu_session: attention_benchmark is not in the bundle" >&2; exit 2; }
    run_attention 300 --json_out "$out/attention_vs_torch.json"
    ;;
  cudnn)
    for t in attention_cudnn_test attention_benchmark train; do
      has "$t" || { echo "gpu_session: $t is not in the bundle" >&2; exit 2; }
    done
    # cuDNN's API logs (CUDNN_LOGLEVEL_DBG=3: every backend call, descriptor and attribute;
    # cuDNN reads the variables when it loads), ours and PyTorch's, packed into one file.
    logs=$(mktemp -d)
    : > "$out/tests.log"
    : > "$out/tests.txt"
    per_check=240  # 25 plans built with every backend call logged; some compile at run time
    CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG="$logs/ours_attention_cudnn_test.log" \
      timed_check "$run" attention_cudnn_test
    record_check tests "$verdict attention_cudnn_test (exit $code, ${secs}s)" \
      -B2 -A12 -m 8 -E 'Failure|FAILED|error|Error|cuDNN'
    # cuBLASLt's DGELU_BGRAD (FSDP_CUDA_DGELU_BIAS_GRAD=1, timed below) has not run on a GPU: its
    # f32 bias gradient beside a bf16 output is not in cuBLASLt's documented types, so check its
    # values against the CPU before the timings mean anything.
    for t in "linear_test CudaLinearTest.GeluInputGradSumsThePreLayersBiasGradient" \
             "model_cuda_test GptCudaTest.CFcBiasGradientFromTheGeluBackwardMatchesTheCpu"; do
      read -r bin filter <<< "$t"
      if has "$bin"; then
        timed_check "$run" "$bin" --gtest_filter="$filter"
        record_check tests "$verdict $bin $filter (exit $code, ${secs}s)" \
          -B2 -A12 -m 8 -E 'Failure|FAILED|error|Error'
      else
        echo "SKIP $bin (not in the bundle)" | tee -a "$out/tests.txt"
      fi
    done
    # gpt2 (head size 64) trained 4 steps with our attention and with cuDNN's: the losses side by side.
    gpt2=(--device=cuda:0 --preset=gpt2 --precision=bf16 --batch_size=4 --seq_len=1024 --steps=4
          --data=random --dropout=0 --optimizer=adamw --log_every=1 --seed=5)
    for engine in ours cudnn; do
      [[ $engine == cudnn ]] && export FSDP_CUDA_ATTENTION=cudnn
      CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG="$logs/train_$engine.cudnn.log" \
        timed_check "$run" train "${gpt2[@]}" --metrics_out="$logs/train_$engine.jsonl"
      unset FSDP_CUDA_ATTENTION
      record_check tests "$verdict gpt2 4 steps, $engine attention (exit $code, ${secs}s)" \
        -B2 -A12 -m 8 -E 'error|Error|cuDNN'
    done
    python3 - "$logs/train_ours.jsonl" "$logs/train_cudnn.jsonl" <<'PY' | tee -a "$out/tests.txt"
import json, sys
def losses(path):
    try:
        with open(path) as f:
            return [json.loads(line)["loss"] for line in f if line.strip()]
    except OSError:
        return []
ours, cudnn = (losses(p) for p in sys.argv[1:])
print("gpt2 losses, ours:  " + " ".join(f"{x:.5f}" for x in ours))
print("gpt2 losses, cuDNN: " + " ".join(f"{x:.5f}" for x in cudnn))
if ours and len(ours) == len(cudnn):
    print(f"max |ours - cuDNN| {max(abs(a - b) for a, b in zip(ours, cudnn)):.3g}")
PY
    # Ours and PyTorch's at the same shapes (B 1, H 12, T 1024 then 2048, D 64), each under the
    # API log: tools/cudnn_log_graph.py torch_sdpa_cudnn.log ours_benchmark.log --ops 0:14 (14:36).
    CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG="$logs/ours_benchmark.log" timeout -k 5 120 \
      "$run" attention_benchmark 1 1 > "$logs/ours_benchmark.txt" 2>&1 ||
      echo "attention_benchmark 1 1: exit $? (its log in the tar)"
    # PyTorch: one training forward (with the statistics) and its backward, as ours.
    CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG="$logs/torch_sdpa_cudnn.log" timeout -k 5 120 \
      python3 - > "$logs/torch_sdpa_cudnn.txt" 2>&1 <<'PY' || echo "PyTorch's cuDNN SDPA: exit $? (its output in the tar)"
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
for t in (1024, 2048):
    q, k, v, dout = (torch.rand((1, 12, t, 64), device="cuda").to(torch.bfloat16) for _ in range(4))
    for x in (q, k, v):
        x.requires_grad_(True)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y.backward(dout)
    torch.cuda.synchronize()
    print(f"T {t}: PyTorch's cuDNN SDPA forward and backward ran")
PY
    tar cJf "$out/cudnn_logs.tar.xz" -C "$logs" . && ls -l "$out/cudnn_logs.tar.xz"
    rm -rf "$logs"
    echo "=== the fused attention against PyTorch's (ours' cuDNN line: attention.txt)"
    run_attention 90
    grep -E 'cuDNN \(FSDP_CUDA_ATTENTION' "$out/attention.txt"
    echo "=== the norm kernels, rows held in registers against loaded (norm.txt)"
    run_row_bench norm 60 11 20
    echo "=== the fused cross-entropy's row block sizes (loss.txt)"
    run_row_bench loss 60 7 5
    echo "=== cuBLASLt's epilogues against our kernels, and c_fc's bias gradient (matmul.txt)"
    if has matmul_benchmark; then
      run_matmul_bench 45 --epilogues_only --samples=10
    else
      echo "SKIP epilogues (matmul_benchmark is not in the bundle)"
    fi
    echo "=== ours against PyTorch eager, with cuDNN's attention"
    run_pytorch $(( phase_start + ${GPU_SESSION_CUDNN_PYTORCH_UNTIL_S:-560} - $(date +%s) )) \
      --attention_cudnn --gemm_tune --dgelu_bias_grad --bias_grad_unfused \
      --ours_env cudnn_tuned:FSDP_CUDA_ATTENTION=cudnn,FSDP_CUDA_GEMM_TUNE=1 \
      --ours_env cudnn_tuned_dgelu:FSDP_CUDA_ATTENTION=cudnn,FSDP_CUDA_GEMM_TUNE=1,FSDP_CUDA_DGELU_BIAS_GRAD=1 \
      --ours_env norms_loaded:FSDP_CUDA_NORM_HOLD_ROWS=0 ||
      echo "pytorch: exit $? (124: killed at the phase's limit)"
    rm -f "$out/vs_pytorch.svg"
    ;;
  profile)
    has train || { echo "gpu_session: train is not in the bundle" >&2; exit 2; }
    [[ -n "$(find_ncu)" ]] || { echo "gpu_session: no ncu (Nsight Compute) on this machine" >&2; exit 2; }
    run_profile 590
    ;;
  kernels)
    ncu=$(find_ncu)
    [[ -n "$ncu" ]] || { echo "gpu_session: no ncu on this machine" >&2; exit 2; }
    has attention_benchmark || { echo "gpu_session: attention_benchmark is not in the bundle" >&2; exit 2; }
    # attention_benchmark 8 1 launches the forward 3 times (2 warm-ups) before its first
    # forward, dk/dv, dq; one iteration keeps the rest of the run short.
    mapfile -t cmd < <(GPU_BUNDLE_PRINT_COMMAND=1 "$run" attention_benchmark 8 1)
    timeout -k 5 300 "$ncu" --target-processes all -k regex:Mma --launch-skip 3 --launch-count 3 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section LaunchStats --section Occupancy --page details \
      "${cmd[@]}" > "$out/kernels_ncu.txt" 2>&1
    echo "ncu exit $? (124: killed after 300 s)"
    grep -E "MmaKernel|Duration|Compute \(SM\) Throughput|Issue Slots Busy|highest-utilized|Registers Per Thread|Achieved Occupancy" \
      "$out/kernels_ncu.txt"
    ;;
  racecheck)
    cs=$(command -v compute-sanitizer ||
         ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer \
           2>/dev/null | head -1)
    [[ -n "$cs" ]] || { echo "gpu_session: no compute-sanitizer on this machine" >&2; exit 2; }
    : > "$out/racecheck.txt"
    : > "$out/racecheck.log"
    # tool, test binary, gtest filter (the smaller cases: the sanitizer is slow); one per line,
    # GPU_SESSION_RACECHECKS names others.
    default_checks="racecheck attention_test *TensorCoreMatchesReference*:*FloatKernelMatchesReference*:*BiasAndKeyMaskMatchReference*:*UnalignedRows*:*AtomicDq*
synccheck attention_test *TensorCoreMatchesReference*:*BiasAndKeyMaskMatchReference*:*AtomicDq*
racecheck norm_test *BitIdentical*:*Strided*:*BiasWithoutWeight*
racecheck softmax_test *
racecheck loss_test *RowPadded*:*BitIdentical*:*IgnoreIndex*
racecheck reduce_test *
racecheck emu_test *"
    mapfile -t checks <<< "${GPU_SESSION_RACECHECKS:-$default_checks}"
    for c in "${checks[@]}"; do
      read -r tool t filter <<< "$c"
      if ! has "$t"; then echo "SKIP $tool $t (not in the bundle)" | tee -a "$out/racecheck.txt"; continue; fi
      if past_deadline; then
        echo "NOT RUN $tool $t (the phase's deadline passed)" | tee -a "$out/racecheck.txt"
        continue
      fi
      timed_check "$cs" --tool "$tool" --error-exitcode 3 --target-processes all "$run" "$t" \
        --gtest_filter="$filter"
      hazards=$(grep -c -E '^========= (Error|Warning)' "$out/check.tmp")
      summary=$(grep -m1 -E '^========= (ERROR|RACECHECK|SYNCCHECK) SUMMARY' "$out/check.tmp")
      record_check racecheck "$verdict $tool $t (exit $code, ${secs}s): $hazards reports; $summary" \
        -m 20 -A6 -E '^========= (Error|Warning)'
    done
    echo "failed checks: $failed" | tee -a "$out/racecheck.txt"
    ;;
  memory)
    has bench_memory || { echo "gpu_session: bench_memory is not in the bundle" >&2; exit 2; }
    "$run" bench_memory --device=cuda:0 --presets=gpt-mini,gopher-44m --world_sizes=2,4 \
      --json_out="$out/memory.json"
    [[ -s "$out/memory.json" ]] && python3 tools/plot.py memory "$out/memory.json" --out "$out/memory.svg"
    ;;
esac
