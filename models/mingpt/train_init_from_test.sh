#!/usr/bin/env bash
# --init_from (nanoGPT's init_from): //models/mingpt:train starts from the
# weights of a checkpoint or of a Hugging Face GPT-2 folder (here the
# checkpoint's `checkpoint export-hf` copy), at step 0 with a fresh optimizer,
# in one process and under DDP and FSDP (which shards the loaded weights,
# holding no whole copy on any rank: its parameters peak is a fresh model's). The
# model it evaluates before changing anything (--lr=0) is the checkpoint's: its
# eval loss equals the one the first run printed after its last step. Such a
# run resumes (the same flags and --resume). Bad combinations exit 2 naming
# the flag, GPT-2 BPE weights on byte-level text among them. A run from
# --init_from resumes.
set -euo pipefail
train="$1"
checkpoint="$2"
source "$3"  # models/common/cli_testing.sh: exits_2
source "$4"  # models/common/losses_testing.sh: eval_loss, close_to
dir="${TEST_TMPDIR}/init_from"
mkdir -p "$dir"

common=(--data=shipped --seq_len=32 --batch_size=4 --log_every=1 --dropout=0
        --eval_data=shipped --eval_batches=2)
"$train" --preset=gpt-nano "${common[@]}" --steps=5 --lr=1e-2 --checkpoint_dir="$dir/run" \
  --metrics_out="$dir/run.jsonl" > /dev/null
trained=$(eval_loss "$dir/run.jsonl")
"$checkpoint" export-hf "$dir/run" "$dir/hf" > /dev/null

# lr 0: the step changes nothing, so the eval after it measures the loaded weights.
frozen=(--steps=1 --lr=0 --weight_decay=0)
"$train" "${common[@]}" "${frozen[@]}" --init_from="$dir/run" --metrics_out="$dir/a.jsonl" \
  > "$dir/a.log"
grep -q "^model gpt-nano(n_layer=3, n_head=3, n_embd=48, vocab_size=256, block_size=128, dropout=0)" "$dir/a.log"
grep -q "^init_from: checkpoint $dir/run/step_000005 (step 5)" "$dir/a.log"
[[ $(eval_loss "$dir/a.jsonl") == "$trained" ]]
"$train" "${common[@]}" "${frozen[@]}" --init_from="$dir/hf" --metrics_out="$dir/b.jsonl" \
  > "$dir/b.log"
grep -q "^init_from: Hugging Face GPT-2 $dir/hf" "$dir/b.log"
[[ $(eval_loss "$dir/b.jsonl") == "$trained" ]]
echo "one process: the checkpoint and its HF export give the trained model's eval loss $trained"

# Data parallel: FSDP shards the loaded weights; DDP broadcasts them.
for strategy in full_shard ddp; do
  "$train" "${common[@]}" "${frozen[@]}" --batch_size=2 --world_size=2 --strategy="$strategy" \
    --init_from="$dir/hf" --metrics_out="$dir/$strategy.jsonl" > "$dir/$strategy.log"
  grep -q "^init_from: Hugging Face GPT-2 $dir/hf" "$dir/$strategy.log"
  close_to "$(eval_loss "$dir/$strategy.jsonl")" "$trained"
done
echo "FSDP and DDP at world 2 start from the same weights"
# FSDP copies each rank's shard from the loaded weights, and no rank holds a
# whole copy: its parameters peak is that of a freshly initialized model
# (gpt-mini, whose whole weights, 10.6 MiB, outweigh a rank's shards and
# gathered units; with a whole copy per rank the peak was 11.27 MiB, not 7.49).
params_peak() { awk '/^rank +params/ { getline; print $2 }' "$1"; }
mini=(--data=shipped --seq_len=32 --batch_size=2 --steps=1)
"$train" --preset=gpt-mini "${mini[@]}" --checkpoint_dir="$dir/mini" > /dev/null
"$train" "${mini[@]}" --lr=0 --world_size=2 --strategy=full_shard --init_from="$dir/mini" \
  > "$dir/mini_fsdp.log"
"$train" --preset=gpt-mini "${mini[@]}" --lr=0 --world_size=2 --strategy=full_shard \
  > "$dir/fresh_fsdp.log"
[[ -n $(params_peak "$dir/mini_fsdp.log") ]]
[[ $(params_peak "$dir/mini_fsdp.log") == $(params_peak "$dir/fresh_fsdp.log") ]] ||
  { echo "FSDP params peak $(params_peak "$dir/mini_fsdp.log") MiB with --init_from," \
      "$(params_peak "$dir/fresh_fsdp.log") MiB fresh"; exit 1; }
echo "FSDP --init_from: params peak $(params_peak "$dir/mini_fsdp.log") MiB per rank, as a fresh model's"

# Fine-tuning trains on from there: the first loss is the trained model's, not a fresh one's.
"$train" "${common[@]}" --steps=2 --lr=1e-3 --init_from="$dir/hf" --metrics_out="$dir/ft.jsonl" \
  --checkpoint_dir="$dir/ft" > /dev/null
"$train" --preset=gpt-nano "${common[@]}" --steps=2 --lr=1e-3 --metrics_out="$dir/fresh.jsonl" \
  > /dev/null
first() { sed -nE 's/.*"step":1,"loss":([0-9.]+).*/\1/p' "$1"; }
awk -v a="$(first "$dir/ft.jsonl")" -v b="$(first "$dir/fresh.jsonl")" 'BEGIN { exit !(a < b - 0.1) }'
"$checkpoint" info "$dir/ft" | grep -q "gpt-nano"
echo "fine-tuning starts below a fresh model's loss and saves checkpoints of the same config"

# A run from --init_from continues with the same flags and --resume: its
# configuration comes from --init_from, its weights from the checkpoint, and
# the losses are the uninterrupted run's (one process, and FSDP at world 2).
ft=(--data=shipped --seq_len=32 --batch_size=4 --log_every=1 --dropout=0 --steps=4 --lr=1e-3
    --init_from="$dir/hf")
for dp in "" "--batch_size=2 --world_size=2 --strategy=full_shard"; do
  # shellcheck disable=SC2086  # $dp is several flags or none
  "$train" "${ft[@]}" $dp --checkpoint_dir="$dir/ft_full" --checkpoint_every=2 \
    --metrics_out="$dir/ft_full.jsonl" > /dev/null
  # shellcheck disable=SC2086
  "$train" "${ft[@]}" $dp --resume="$dir/ft_full/step_000002" \
    --checkpoint_dir="$dir/ft_resumed" --metrics_out="$dir/ft_resumed.jsonl" > "$dir/ft_resumed.log"
  grep -q "^init_from: Hugging Face GPT-2 $dir/hf (its configuration; --resume loads the weights)" \
    "$dir/ft_resumed.log"
  grep -q "resumed from $dir/ft_full/step_000002 at step 2" "$dir/ft_resumed.log"
  [[ $(losses "$dir/ft_resumed.jsonl" | cut -d' ' -f1 | tr '\n' ' ') == "3 4 " ]]
  same_losses "$dir/ft_full.jsonl" "$dir/ft_resumed.jsonl" "resumed from --init_from${dp:+ ($dp)}"
  rm -rf "$dir/ft_full" "$dir/ft_resumed" "$dir/ft_full.jsonl" "$dir/ft_resumed.jsonl"
done
echo "a run from --init_from resumes with the uninterrupted run's losses"

# Bad input: exit 2, naming what was wrong.
expect_error() { exits_2 "$1" "$train" "${@:2}" --steps=1; }
expect_error "--preset / --vocab_size with --init_from" --init_from="$dir/hf" --preset=gpt2
# The default preset given by name is still a preset given (it was ignored without a word).
expect_error "--preset / --vocab_size with --init_from" --init_from="$dir/hf" --preset=gpt-mini
expect_error "--init_from: $dir/none: no such folder" --init_from="$dir/none"
"$train" --preset=gpt-nano --data=random --vocab_size=100 --steps=1 --seq_len=16 --batch_size=2 \
  --checkpoint_dir="$dir/small_vocab" > /dev/null
expect_error "--init_from: the model's vocabulary 100 is smaller than the data's vocabulary 256" \
  --init_from="$dir/small_vocab" --data=shipped
# GPT-2 BPE weights on byte-level text (the default --data=shipped): their ids
# are BPE tokens, not bytes, so the run is refused, pointing to tokenize. The
# model: vocabulary 50257 with GPT-2's tokenizer recorded, exported as a
# Hugging Face GPT-2 folder with vocab.json + merges.txt (as the hub's gpt2)
# and without (the vocabulary tells).
"$train" --preset=gpt-nano --data=random --tokenizer=gpt2 --steps=1 --seq_len=8 --batch_size=1 \
  --checkpoint_dir="$dir/bpe" > /dev/null
"$checkpoint" export-hf "$dir/bpe" "$dir/bpe_hf" > /dev/null
"$checkpoint" export-hf "$dir/bpe" "$dir/bpe_hf_bare" --tokenizer=none > /dev/null
# Not into a folder that holds files already (they would mix).
exits_2 "checkpoint: error: '$dir/bpe_hf' is not empty; give a new folder" \
  "$checkpoint" export-hf "$dir/bpe" "$dir/bpe_hf"
# A failed export leaves nothing: the same command runs again once fixed.
exits_2 "--tokenizer=$dir: " "$checkpoint" export-hf "$dir/bpe" "$dir/failed_hf" \
  --tokenizer="$dir"
[[ ! -e "$dir/failed_hf" ]] || { echo "a failed export left $dir/failed_hf"; exit 1; }
bytes="but --data is byte-level text (its ids are byte values 0..255, not those tokens): "
bytes+="encode it with //tools:tokenize (text -> GPT-2 token ids)"
expect_error "--init_from=$dir/bpe_hf with --data=shipped: the weights' ids are tokens of \
the tokenizer $dir/bpe_hf they record, $bytes" --init_from="$dir/bpe_hf"
expect_error "--init_from=$dir/bpe_hf_bare with --data=shipped: the weights are a Hugging Face \
model of 50257 token ids (GPT-2's BPE has 50257), not of 256 bytes, $bytes" \
  --init_from="$dir/bpe_hf_bare"
expect_error "--init_from=$dir/bpe with --data=shipped: the weights' ids are tokens of the \
tokenizer gpt2 they record, $bytes" --init_from="$dir/bpe"
# --tokenizer=none trains on the bytes anyway; a byte-level checkpoint with a
# padded vocabulary (320 ids) initializes byte-level runs as before.
"$train" --init_from="$dir/bpe_hf" --tokenizer=none --steps=1 --seq_len=8 --batch_size=1 \
  > /dev/null
"$train" --preset=gpt-nano --data=shipped --vocab_size=320 --steps=1 --seq_len=8 --batch_size=1 \
  --checkpoint_dir="$dir/padded" > /dev/null
"$train" --init_from="$dir/padded" --steps=1 --seq_len=8 --batch_size=1 > /dev/null
echo "bad input exits 2 naming it; BPE weights on byte text are refused"
