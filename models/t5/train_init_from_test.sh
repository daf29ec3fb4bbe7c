#!/usr/bin/env bash
# --init_from: //models/t5:train starts from the weights of one of its
# checkpoints (either kind), or of a Hugging Face T5 folder (`checkpoint
# export-hf` of one), at step 0 with a fresh optimizer and their
# configuration, in one process and under FSDP and DDP. The model it
# evaluates after a step that changes nothing (--lr=0) is the checkpoint's:
# its eval loss equals the one the first run printed after its last step. A
# model vocabulary larger than the data's (T5's padded one) is taken, but a
# checkpoint's for data of another vocabulary is refused. Such a
# run resumes (the same flags and --resume). Bad combinations exit 2 naming
# the flag.
set -euo pipefail
train="$1"
source "$2"  # models/common/cli_testing.sh: exits_2
source "$3"  # models/common/losses_testing.sh: eval_loss, close_to
checkpoint="$4"  # //tools:checkpoint
dir="${TEST_TMPDIR}/init_from"
mkdir -p "$dir"

common=(--batch_size=4 --encoder_length=32 --log_every=1 --dropout=0 --eval_data=shipped
        --eval_batches=2)
# The first run: v1.1 (untied lm_head, gated-GELU), so the configuration comes from the checkpoint.
"$train" --v1_1 "${common[@]}" --steps=3 --lr=3e-3 --checkpoint_dir="$dir/run" \
  --metrics_out="$dir/run.jsonl" > /dev/null
trained=$(eval_loss "$dir/run.jsonl")
# And a sharded checkpoint of the same weights (FSDP at world 2 writes one).
"$train" --v1_1 "${common[@]}" --steps=3 --lr=3e-3 --batch_size=2 --world_size=2 \
  --strategy=full_shard --checkpoint_dir="$dir/sharded" --metrics_out="$dir/sharded.jsonl" \
  > /dev/null
trained_sharded=$(eval_loss "$dir/sharded.jsonl")

frozen=(--steps=1 --lr=0 --weight_decay=0)
"$train" "${common[@]}" "${frozen[@]}" --init_from="$dir/run" --metrics_out="$dir/a.jsonl" \
  > "$dir/a.log"
grep -q "feed_forward_proj=gated-gelu, tie_word_embeddings=false" "$dir/a.log"
grep -q "^init_from: checkpoint $dir/run/step_000003 (step 3)" "$dir/a.log"
[[ $(eval_loss "$dir/a.jsonl") == "$trained" ]]
echo "one process: the checkpoint's eval loss $trained"

# Data parallel from either kind: FSDP reads each rank's shard, DDP a whole copy.
for from in run sharded; do
  want=$trained
  [[ $from == sharded ]] && want=$trained_sharded
  for strategy in full_shard ddp; do
    "$train" "${common[@]}" "${frozen[@]}" --batch_size=2 --world_size=2 --strategy="$strategy" \
      --init_from="$dir/$from" --metrics_out="$dir/$from-$strategy.jsonl" > "$dir/$from-$strategy.log"
    grep -q "^init_from: checkpoint $dir/$from/step_000003 (step 3)" "$dir/$from-$strategy.log"
    close_to "$(eval_loss "$dir/$from-$strategy.jsonl")" "$want"
  done
done
echo "FSDP and DDP at world 2 start from either kind of checkpoint"

# The checkpoint as a Hugging Face T5 folder, and back: the same model, in one
# process and under FSDP.
"$checkpoint" export-hf "$dir/run" "$dir/hf" > "$dir/export.log"
grep -q "wrote the Hugging Face T5 folder $dir/hf (config.json, model.safetensors)" "$dir/export.log"
grep -q '"feed_forward_proj": "gated-gelu"' "$dir/hf/config.json"
# The special ids the run's batches used: byte-level text with no eos (null),
# pad and decoder start 0.
grep -q '"eos_token_id": null,' "$dir/hf/config.json"
grep -q '"pad_token_id": 0,' "$dir/hf/config.json"
grep -q '"decoder_start_token_id": 0,' "$dir/hf/config.json"
"$train" "${common[@]}" "${frozen[@]}" --init_from="$dir/hf" --metrics_out="$dir/hf.jsonl" \
  > "$dir/hf.log"
grep -q "^init_from: Hugging Face T5 $dir/hf" "$dir/hf.log"
grep -q "hf-t5(vocab_size=356, .*feed_forward_proj=gated-gelu, tie_word_embeddings=false)" \
  "$dir/hf.log"
[[ $(eval_loss "$dir/hf.jsonl") == "$trained" ]]
"$train" "${common[@]}" "${frozen[@]}" --batch_size=2 --world_size=2 --strategy=full_shard \
  --init_from="$dir/hf" --metrics_out="$dir/hf-fsdp.jsonl" > /dev/null
close_to "$(eval_loss "$dir/hf-fsdp.jsonl")" "$trained"
echo "a Hugging Face T5 folder (export-hf of the checkpoint) gives its eval loss"

# A model vocabulary larger than the data's ids + sentinels (356 rows for 256
# bytes + 50 sentinels): the first rows are used, the rest stay as they are.
"$train" "${common[@]}" "${frozen[@]}" --init_from="$dir/hf" --num_sentinels=50 > "$dir/pad.log"
grep -q "^vocabulary: 356 rows, of which the data's 256 ids and 50 sentinels (ids 256..305) use the first 306" \
  "$dir/pad.log"
echo "a padded vocabulary is taken"

# A run from --init_from continues with the same flags and --resume (its
# configuration from --init_from, its weights from the checkpoint): the
# uninterrupted run's losses, with dropout on, in one process and under FSDP.
ft=(--batch_size=4 --encoder_length=32 --log_every=1 --dropout=0.1 --steps=4 --lr=1e-3
    --init_from="$dir/hf")
for dp in "" "--batch_size=2 --world_size=2 --strategy=full_shard"; do
  # shellcheck disable=SC2086  # $dp is several flags or none
  "$train" "${ft[@]}" $dp --checkpoint_dir="$dir/ft_full" --checkpoint_every=2 \
    --metrics_out="$dir/ft_full.jsonl" > /dev/null
  # shellcheck disable=SC2086
  "$train" "${ft[@]}" $dp --resume="$dir/ft_full/step_000002" --checkpoint_dir="$dir/ft_resumed" \
    --metrics_out="$dir/ft_resumed.jsonl" > "$dir/ft_resumed.log"
  grep -q "^init_from: Hugging Face T5 $dir/hf (its configuration; --resume loads the weights)" \
    "$dir/ft_resumed.log"
  [[ $(losses "$dir/ft_resumed.jsonl" | cut -d' ' -f1 | tr '\n' ' ') == "3 4 " ]]
  same_losses "$dir/ft_full.jsonl" "$dir/ft_resumed.jsonl" "resumed from --init_from${dp:+ ($dp)}"
  rm -rf "$dir/ft_full" "$dir/ft_resumed" "$dir/ft_full.jsonl" "$dir/ft_resumed.jsonl"
done
echo "a run from --init_from resumes with the uninterrupted run's losses"

exits_2 "--preset / --v1_1 with --init_from" "$train" "${frozen[@]}" \
  --init_from="$dir/run" --preset=t5-small
exits_2 "--preset / --v1_1 with --init_from" "$train" "${frozen[@]}" \
  --init_from="$dir/run" --preset=t5-tiny
exits_2 "--init_from=$dir/nope: " "$train" "${frozen[@]}" --init_from="$dir/nope"
exits_2 "--init_from: the model's vocabulary 356 is smaller than the data's 456" "$train" \
  "${frozen[@]}" --init_from="$dir/hf" --num_sentinels=200
# A checkpoint's rows are its data's ids and sentinels: other data, or other
# sentinels, would put each id on a row that meant another token.
exits_2 "--init_from=$dir/run: the weights were trained on data of 256 ids and 100 sentinels \
(ids 256..355), but this run's data has 200 ids and 100 sentinels (ids 200..299): each id would \
land on a row that meant another token" "$train" "${frozen[@]}" --init_from="$dir/run" \
  --data=random --vocab_size=200
exits_2 "but this run's data has 256 ids and 50 sentinels (ids 256..305)" "$train" \
  "${frozen[@]}" --init_from="$dir/sharded" --num_sentinels=50
sed -i 's/"feed_forward_proj": "gated-gelu"/"feed_forward_proj": "gated-silu"/' "$dir/hf/config.json"
exits_2 "--init_from=$dir/hf: $dir/hf/config.json: feed_forward_proj 'gated-silu'" "$train" \
  "${frozen[@]}" --init_from="$dir/hf"
echo "bad combinations exit 2 naming the flag"
echo PASS
