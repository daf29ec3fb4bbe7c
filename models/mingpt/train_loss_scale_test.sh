#!/usr/bin/env bash
# --loss_scale in the train binary (fp32 on the CPU; fp16 needs a GPU):
# a power-of-two scale trains bit for bit like none; a dynamic scale that
# overflows skips steps and backs off until steps apply, in one process and
# under ZeRO-1 / FULL_SHARD (every rank skips together); its state resumes
# from a checkpoint; a bad flag is named.
set -euo pipefail
train="$1"
dir="${TEST_TMPDIR}/loss_scale"
mkdir -p "$dir"
common=(--preset=gpt-nano --data=random --batch_size=4 --seq_len=32 --log_every=1 --dropout=0)
fail() { echo "FAIL: $*" >&2; exit 1; }
metrics() { sed -E 's/.*"step":([0-9]+),"loss":([0-9.]+),"lr":[^,]*,"ms":[^,]*,"tokens_per_s":[^,]*,"grad_norm":([^,]*),.*/\1 \2 \3/' "$1"; }

# A power of two: the same losses and gradient norms, bit for bit.
"$train" "${common[@]}" --steps=4 --metrics_out="$dir/none.jsonl" > /dev/null
"$train" "${common[@]}" --steps=4 --loss_scale=1024 --metrics_out="$dir/fixed.jsonl" > "$dir/fixed.log"
grep -q "loss scale: fixed 1024" "$dir/fixed.log" || fail "the fixed scale is reported"
diff <(metrics "$dir/none.jsonl") <(metrics "$dir/fixed.jsonl") || fail "scale 1024 changed training"

# Dynamic from 1e40 (beyond fp32): the first steps overflow, are skipped and
# halve the scale; then steps apply.
for dp in "" "--world_size=2 --strategy=zero1" "--world_size=2 --strategy=full_shard"; do
  # shellcheck disable=SC2086
  rm -f "$dir/dynamic.jsonl"
  "$train" "${common[@]}" $dp --steps=10 --loss_scale=dynamic --init_loss_scale=1e40 \
    --metrics_out="$dir/dynamic.jsonl" > "$dir/dynamic.log" || fail "dynamic ($dp)"
  skipped=$(grep -c "inf/nan gradients at loss scale" "$dir/dynamic.log" || true)
  (( skipped >= 1 && skipped < 10 )) || { cat "$dir/dynamic.log"; fail "$skipped skipped steps ($dp)"; }
  [[ $(grep -c '"skipped":true' "$dir/dynamic.jsonl") == "$skipped" ]] ||
    fail "the metrics do not mark the $skipped skipped steps ($dp)"
  grep -q "step 1: inf/nan gradients at loss scale 1e+40: skipped; loss scale dynamic (now 5e+39)" \
    "$dir/dynamic.log" || fail "the first step is skipped and the scale halves ($dp)"
  grep -Eq "^step +10 \| loss [0-9]" "$dir/dynamic.log" || fail "the run ends ($dp)"
  echo "ok: ${dp:-one process}: $skipped of 10 steps skipped"
done

# The scale resumes from a checkpoint: 10 steps in one go equal 4 + 6 resumed.
"$train" "${common[@]}" --steps=10 --loss_scale=dynamic --init_loss_scale=1e40 \
  --metrics_out="$dir/full.jsonl" > /dev/null
"$train" "${common[@]}" --steps=4 --loss_scale=dynamic --init_loss_scale=1e40 \
  --checkpoint_dir="$dir/ckpt" --metrics_out="$dir/part1.jsonl" > /dev/null
"$train" "${common[@]}" --steps=10 --loss_scale=dynamic --init_loss_scale=1e40 \
  --checkpoint_dir="$dir/ckpt" --resume=latest --metrics_out="$dir/part2.jsonl" > "$dir/resumed.log"
grep -q "resumed from" "$dir/resumed.log" || fail "resumed"
diff <(metrics "$dir/full.jsonl") <(cat <(metrics "$dir/part1.jsonl") <(metrics "$dir/part2.jsonl")) ||
  fail "the resumed run differs (the loss scale was not restored?)"
# The metrics mark each skipped step (the lines that said so) and hold each step's scale.
skipped=$("$train" "${common[@]}" --steps=10 --loss_scale=dynamic --init_loss_scale=1e40 |
  grep -c "inf/nan gradients at loss scale" || true)
[[ $(grep -c '"skipped":true' "$dir/full.jsonl") == "$skipped" && $skipped -ge 1 ]] ||
  fail "$skipped steps skipped, metrics: $(grep -c '"skipped":true' "$dir/full.jsonl")"
[[ $(grep -c '"loss_scale":' "$dir/full.jsonl") == 10 ]] || fail "a step without its loss scale"
# Resumed with another --init_loss_scale: the checkpoint's scale goes on, and a note says so;
# a fixed scale drops the checkpoint's dynamic one, and a note says that.
"$train" "${common[@]}" --steps=11 --loss_scale=dynamic --init_loss_scale=8 \
  --checkpoint_dir="$dir/ckpt" --resume=latest > /dev/null 2> "$dir/note.txt"
grep -q "train: note: the dynamic loss scale continues from the checkpoint's .* in place of the \
initial 8 (--init_loss_scale applies to a fresh start)" "$dir/note.txt" ||
  { cat "$dir/note.txt"; fail "no note that the checkpoint's scale continues"; }
"$train" "${common[@]}" --steps=12 --loss_scale=8 \
  --checkpoint_dir="$dir/ckpt" --resume=latest > /dev/null 2> "$dir/note.txt"
grep -q "train: note: the checkpoint's dynamic loss scale (.*) is not continued: this run's loss \
scale is fixed 8" "$dir/note.txt" || { cat "$dir/note.txt"; fail "no note that it is dropped"; }

# A bad flag: exit 2, named.
set +e
"$train" "${common[@]}" --steps=1 --loss_scale=lots 2> "$dir/err.txt"; code=$?
set -e
[[ $code == 2 ]] && grep -q "\-\-loss_scale='lots' is not auto, none, dynamic" "$dir/err.txt" ||
  { cat "$dir/err.txt"; fail "bad --loss_scale: exit $code"; }
echo PASS
