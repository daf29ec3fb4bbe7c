#!/usr/bin/env bash
# //models/t5:train: --resume continues with exactly the losses of an
# uninterrupted run, with dropout on; a corrupted checkpoint is a clear error;
# bad flags exit 2 with a message naming the flag.
set -euo pipefail
train="$1"
dir="${TEST_TMPDIR}/resume"
mkdir -p "$dir"
# A schedule that does not depend on --steps, so the 3-step run and the
# resumed one follow the 6-step run's learning rates (warmup and decay included).
common=(--preset=t5-tiny --steps=6 --batch_size=4 --encoder_length=32 --dropout=0.1
        --lr_schedule=cosine:max_lr=3e-3,min_lr=3e-4,warmup_steps=2,total_steps=6 --log_every=1)

losses() { sed -E 's/.*"step":([0-9]+),"loss":([0-9.]+).*/\1 \2/' "$1"; }

"$train" "${common[@]}" --metrics_out="$dir/full.jsonl" > "$dir/full.log"
"$train" "${common[@]}" --steps=3 --checkpoint_dir="$dir/ckpt" --metrics_out="$dir/part1.jsonl" > /dev/null
"$train" "${common[@]}" --checkpoint_dir="$dir/ckpt" --resume=latest \
  --metrics_out="$dir/part2.jsonl" > "$dir/resumed.log"
grep -q "resumed from .*step_000003 at step 3" "$dir/resumed.log"
grep -q "tok/s counts encoder + decoder tokens" "$dir/full.log"

diff <(losses "$dir/full.jsonl") <(cat <(losses "$dir/part1.jsonl") <(losses "$dir/part2.jsonl"))
[[ $(losses "$dir/full.jsonl" | wc -l) == 6 ]]
echo "resumed losses equal the uninterrupted run's:"
losses "$dir/full.jsonl"

# Dropout is on: the same run without dropout gives other losses (so the
# equality above covers the per-step dropout masks).
"$train" "${common[@]}" --dropout=0 --metrics_out="$dir/nodrop.jsonl" > /dev/null
if diff -q <(losses "$dir/full.jsonl") <(losses "$dir/nodrop.jsonl") > /dev/null; then
  echo "dropout 0.1 gave the losses of dropout 0"; exit 1
fi

# The loss falls over the 6 steps.
first=$(losses "$dir/full.jsonl" | head -1 | cut -d' ' -f2)
last=$(losses "$dir/full.jsonl" | tail -1 | cut -d' ' -f2)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }'

# A resume may change the dropout (the forward's alone), and says so.
"$train" "${common[@]}" --steps=4 --dropout=0.2 --resume="$dir/ckpt/step_000003" \
  > /dev/null 2> "$dir/dropout_note.txt"
grep -qF "train: note: the checkpoint was trained with dropout_rate=0.1; continuing with \
dropout_rate=0.2" "$dir/dropout_note.txt" ||
  { echo "expected a note naming both dropouts:"; cat "$dir/dropout_note.txt"; exit 1; }

# A checkpoint of another model is refused, naming the fields that differ.
set +e
"$train" "${common[@]}" --v1_1 --checkpoint_dir="$dir/ckpt" --resume=latest \
  > /dev/null 2> "$dir/err_config.txt"; code=$?
set -e
want="(feed_forward_proj relu there, gated-gelu here; tie_word_embeddings true there, false here)"
[[ $code == 2 ]] && grep -qF "$want" "$dir/err_config.txt" ||
  { echo "expected exit 2 and $want; got $code:"; cat "$dir/err_config.txt"; exit 1; }

# Resuming with another LR schedule continues with it, and says so (one
# process, and rank 0 of DDP, which resumes the single-process format).
for dp in "" "--world_size=2 --strategy=ddp --batch_size=2"; do
  # shellcheck disable=SC2086
  "$train" "${common[@]}" --steps=4 --lr_schedule=constant --resume="$dir/ckpt/step_000003" $dp \
    > /dev/null 2> "$dir/err_schedule.txt"
  grep -qF "note: the checkpoint was trained with lr schedule cosine:" "$dir/err_schedule.txt" &&
    grep -qF "; continuing with constant" "$dir/err_schedule.txt" ||
    { echo "no schedule note with '$dp':"; cat "$dir/err_schedule.txt"; exit 1; }
  [[ $(grep -c "lr schedule" "$dir/err_schedule.txt") == 1 ]]
done

# A corrupted checkpoint is refused with a message naming the file.
model="$dir/ckpt/step_000006/model.safetensors"
printf '\x01' | dd of="$model" bs=1 seek=$(( $(stat -c %s "$model") - 5 )) conv=notrunc 2>/dev/null
if "$train" "${common[@]}" --checkpoint_dir="$dir/ckpt" --resume=latest > /dev/null 2> "$dir/err.txt"; then
  echo "resuming from a corrupted checkpoint should fail"; exit 1
fi
grep -q "model.safetensors' is corrupted: checksum" "$dir/err.txt"
grep -q "^train: error: --resume=latest: " "$dir/err.txt"

# Bad flags: exit code 2 and a message naming the flag.
bad_flag() {  # expected message, then the flags
  local want="$1"; shift
  local code
  set +e
  "$train" "$@" > /dev/null 2> "$dir/err_flag.txt"; code=$?
  set -e
  if [[ $code != 2 ]] || ! grep -qF -- "$want" "$dir/err_flag.txt"; then
    echo "flags $* gave exit code $code and:"; cat "$dir/err_flag.txt"
    echo "expected exit code 2 and a message with: $want"; exit 1
  fi
}
bad_flag "--preset: unknown t5 preset 't5-9000'" --preset=t5-9000 --steps=1
bad_flag "--encoder_length=1 --num_sentinels=100" --encoder_length=1 --steps=1
bad_flag "--encoder_length=0 must be >= 1" --encoder_length=0 --steps=1
bad_flag "--optimizer='lion' is not one of adamw, sgd" --optimizer=lion --steps=1
bad_flag "--precision: unknown precision 'fp8'" --precision=fp8 --steps=1
bad_flag "--batch_size=0 must be >= 1" --batch_size=0 --steps=1
bad_flag "--dropout=1.5 is not in [0, 1)" --dropout=1.5 --steps=1
bad_flag "--num_sentinels=1" --num_sentinels=1 --steps=1
bad_flag "--loss_scale='big' is not auto, none, dynamic" --loss_scale=big --steps=1
bad_flag "--grad_accum_steps=-1 must be >= 1" --grad_accum_steps=-1 --steps=1
bad_flag "--peak_tflops=-1 must be finite and >= 0" --peak_tflops=-1 --steps=1

# MFU against a given peak: t5-tiny (d_model 128, 4 heads of 32, d_ff 512,
# 2+2 layers, vocab 356) at 32 encoder and 8 decoder tokens is 116,416,512
# FLOPs an example (t5::FlopsPerExample, by hand: projections 25,165,824 +
# 11,534,336, scores 1,376,256, lm_head 729,088; x3), 465,666,048 a step of 4
# examples, in one process and over 2 ranks of 2 (the global batch): every
# metrics line's mfu * ms * peak gives it back (a low peak, so that the 4
# digits of mfu leave it within 1%).
for run in "--batch_size=4" "--batch_size=2 --world_size=2"; do
  # shellcheck disable=SC2086  # $run is two flags
  "$train" --steps=2 --encoder_length=32 --log_every=1 --peak_tflops=0.01 $run \
    --metrics_out="$dir/mfu.jsonl" > "$dir/mfu.log"
  grep -Eq "^mean .* tokens/s \(.*\), MFU [0-9.]+% over 1 steps" "$dir/mfu.log"
  sed -E 's/.*"ms":([0-9.]+),.*"mfu":([0-9.]+),.*/\1 \2/' "$dir/mfu.jsonl" | awk '
    { f = $1 / 1000 * $2 * 0.01e12; if (f < 0.99 * 465666048 || f > 1.01 * 465666048) bad = 1; n++ }
    END { exit bad || n != 2 }' ||
    { echo "$run: the MFU does not count 465,666,048 FLOPs a step"; cat "$dir/mfu.jsonl"; exit 1; }
  rm "$dir/mfu.jsonl"
done
if grep -q "MFU" "$dir/full.log"; then echo "an MFU without a known peak"; exit 1; fi

# Gradient accumulation: 2 micro-batches of 2 (one process) and 2 of 1 on
# each of 2 FSDP ranks give batch 4's losses (1e-5; no dropout).
ga_flags=(--preset=t5-tiny --steps=3 --encoder_length=32 --log_every=1 --dropout=0)
"$train" "${ga_flags[@]}" --batch_size=4 --metrics_out="$dir/ga_ref.jsonl" > /dev/null
"$train" "${ga_flags[@]}" --batch_size=2 --grad_accum_steps=2 \
  --metrics_out="$dir/ga_k2.jsonl" > "$dir/ga_k2.log"
grep -q "batch 2 micro-batches x 2 x (32 encoder" "$dir/ga_k2.log"
"$train" "${ga_flags[@]}" --batch_size=1 --grad_accum_steps=2 --world_size=2 \
  --strategy=full_shard --metrics_out="$dir/ga_fsdp.jsonl" > /dev/null
close() {  # close WANT GOT: every step's loss within 1e-5 relative
  join <(losses "$1") <(losses "$2") | awk -v f="$2" '
    { d = $2 - $3; if (d < 0) d = -d; if (d > 1e-5 * $2 + 2e-6) { print f ": step " $1; bad = 1 } n++ }
    END { exit bad || n != 3 }'
}
close "$dir/ga_ref.jsonl" "$dir/ga_k2.jsonl"
close "$dir/ga_ref.jsonl" "$dir/ga_fsdp.jsonl"

# Evaluation (--eval_data): after steps 2 and 3, the same numbers from one
# process and from 2 FSDP ranks with 2 micro-batches (each rank its rows), and
# the training losses unchanged with dropout on.
evals() { sed -nE 's/.*"step":([0-9]+),"eval_loss":([0-9.]+).*/\1 \2/p' "$1"; }
"$train" "${ga_flags[@]}" --batch_size=4 --eval_data=shipped --eval_every=2 \
  --metrics_out="$dir/ev_one.jsonl" > /dev/null
"$train" "${ga_flags[@]}" --batch_size=1 --grad_accum_steps=2 --world_size=2 --strategy=full_shard \
  --eval_data=shipped --eval_every=2 --metrics_out="$dir/ev_fsdp.jsonl" > /dev/null
[[ "$(evals "$dir/ev_one.jsonl" | cut -d' ' -f1 | tr '\n' ' ')" == "2 3 " ]]
join <(evals "$dir/ev_one.jsonl") <(evals "$dir/ev_fsdp.jsonl") | awk '
  { d = $2 - $3; if (d < 0) d = -d; if (d > 1e-5 * $2) { print "eval " $1 ": " $2 " vs " $3; bad = 1 } n++ }
  END { exit bad || n != 2 }'
"$train" "${ga_flags[@]}" --batch_size=4 --dropout=0.1 --metrics_out="$dir/ev_plain.jsonl" > /dev/null
"$train" "${ga_flags[@]}" --batch_size=4 --dropout=0.1 --eval_data=shipped \
  --metrics_out="$dir/ev_drop.jsonl" > /dev/null
diff <(sed -nE 's/.*"step":([0-9]+),"loss":([0-9.]+).*/\1 \2/p' "$dir/ev_plain.jsonl") \
  <(sed -nE 's/.*"step":([0-9]+),"loss":([0-9.]+).*/\1 \2/p' "$dir/ev_drop.jsonl")
bad_flag "--eval_data=random: its vocabulary 50257 is not the training data's 256" \
  --eval_data=random --steps=1
bad_flag "--eval_batches=0 must be >= 1" --eval_data=shipped --eval_batches=0 --steps=1
# --val_fraction: the last tenth of the text held out, evaluated after steps 2 and 3.
"$train" "${ga_flags[@]}" --batch_size=4 --val_fraction=0.1 --eval_every=2 \
  --metrics_out="$dir/ev_split.jsonl" > "$dir/ev_split.log"
[[ "$(evals "$dir/ev_split.jsonl" | cut -d' ' -f1 | tr '\n' ' ')" == "2 3 " ]]
grep -q "bytes \[0, 510478) of " "$dir/ev_split.log"
bad_flag "--val_fraction=-0.5: must be in [0, 1)" --val_fraction=-0.5 --steps=1

# Loss scaling: a power of two trains bit for bit like none; an overflowing
# dynamic scale skips steps (every rank together) and backs off.
# (The fixed run's records also hold its "loss_scale".)
strip() { sed -E 's/"ms":[^,]*,"tokens_per_s":[^,]*,//; s/"loss_scale":[^,]*,//; s/"memory".*//' "$1"; }
ls_flags=(--preset=t5-tiny --steps=3 --batch_size=4 --log_every=1 --dropout=0)
"$train" "${ls_flags[@]}" --metrics_out="$dir/ls_none.jsonl" > /dev/null
"$train" "${ls_flags[@]}" --loss_scale=4096 --metrics_out="$dir/ls_fixed.jsonl" > /dev/null
diff <(strip "$dir/ls_none.jsonl") <(strip "$dir/ls_fixed.jsonl")
"$train" "${ls_flags[@]}" --steps=8 --world_size=2 --loss_scale=dynamic --init_loss_scale=1e40 \
  > "$dir/ls_dynamic.log"
grep -q "step 1: inf/nan gradients at loss scale 1e+40: skipped" "$dir/ls_dynamic.log"
grep -Eq "^step +8 \| loss [0-9]" "$dir/ls_dynamic.log"
echo PASS
