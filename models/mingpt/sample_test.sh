#!/usr/bin/env bash
# //models/mingpt:sample on checkpoints of //models/mingpt:train: it reads the
# model's configuration from the checkpoint, takes a checkpoint_dir (its
# latest step) or a step folder of either kind (a sharded FSDP one samples
# exactly as its consolidated copy does), repeats with the seed and not
# across seeds, prints text for byte-level models and ids otherwise, streams
# one sample and separates several; bad input exits 2 naming what was wrong.
set -euo pipefail
train="$1"
sample="$2"
checkpoint="$3"
tokenize="$4"
text="$5"
source "$6"  # models/common/cli_testing.sh: exits_2
dir="${TEST_TMPDIR}/sample"
mkdir -p "$dir"

common=(--preset=gpt-nano --data=shipped --steps=4 --seq_len=32 --batch_size=4 --log_every=4
        --lr=1e-2)
"$train" "${common[@]}" --checkpoint_dir="$dir/one" --checkpoint_every=2 > /dev/null
"$train" "${common[@]}" --batch_size=2 --world_size=2 --strategy=full_shard \
  --checkpoint_dir="$dir/fsdp" > /dev/null
"$checkpoint" consolidate "$dir/fsdp" "$dir/fsdp_whole" > /dev/null

# One sample: prompt then 40 bytes, streamed, and a newline.
"$sample" --checkpoint="$dir/one" --prompt="Light is" --max_new_tokens=40 --seed=7 \
  > "$dir/a.txt" 2> "$dir/a.err"
grep -q "^gpt-nano(n_layer=3, n_head=3, n_embd=48, vocab_size=256, block_size=128, dropout=0.1) from checkpoint $dir/one/step_000004 (step 4)" "$dir/a.err"
grep -Eq "^generated 40 tokens, 1 rows, in [0-9]+ ms" "$dir/a.err"
[[ $(head -c 8 "$dir/a.txt") == "Light is" ]]
[[ $(wc -c < "$dir/a.txt") == 49 ]]
# The same seed and step folder (named directly) repeat it; another seed does not.
"$sample" --checkpoint="$dir/one/step_000004" --prompt="Light is" --max_new_tokens=40 --seed=7 \
  2> /dev/null | cmp - "$dir/a.txt"
"$sample" --checkpoint="$dir/one" --prompt="Light is" --max_new_tokens=40 --seed=8 \
  2> /dev/null | { ! cmp -s - "$dir/a.txt"; }
# The weights are the checkpoint's: step 2's model samples otherwise.
"$sample" --checkpoint="$dir/one/step_000002" --prompt="Light is" --max_new_tokens=40 --seed=7 \
  2> /dev/null | { ! cmp -s - "$dir/a.txt"; }
echo "one process: 40 new bytes, repeatable by seed, step 2 unlike step 4"

# A sharded FSDP checkpoint samples exactly as its consolidated copy.
"$sample" --checkpoint="$dir/fsdp" --num_samples=3 --max_new_tokens=30 --temperature=1 --top_p=0.9 \
  > "$dir/sharded.txt" 2> /dev/null
"$sample" --checkpoint="$dir/fsdp_whole" --num_samples=3 --max_new_tokens=30 --temperature=1 \
  --top_p=0.9 > "$dir/whole.txt" 2> /dev/null
cmp "$dir/sharded.txt" "$dir/whole.txt"
[[ $(grep -c '^---------------$' "$dir/sharded.txt") == 2 ]]
echo "FSDP sharded checkpoint = its consolidated copy; 3 samples"

# Exported as a Hugging Face GPT-2 folder, the model samples the same bytes.
"$checkpoint" export-hf "$dir/one" "$dir/hf" > /dev/null
"$sample" --checkpoint="$dir/hf" --prompt="Light is" --max_new_tokens=40 --seed=7 \
  2> "$dir/hf.err" | cmp - "$dir/a.txt"
grep -q "from Hugging Face GPT-2 $dir/hf |" "$dir/hf.err"
echo "its Hugging Face GPT-2 export samples the same bytes"

# Greedy with ids: "L" is 76; 5 ids follow the prompt's.
"$sample" --checkpoint="$dir/one" --prompt_tokens=76,105 --max_new_tokens=5 --temperature=0 \
  --print=tokens > "$dir/ids.txt" 2> /dev/null
grep -Eq '^76 105( [0-9]+){5} $' "$dir/ids.txt"

# Several prompts of unequal lengths in one batch (--prompts_file, an empty
# line skipped, 2 samples each), greedy: each row is its prompt's greedy
# continuation alone, in the file's order.
printf 'Light is\n\nThe\nColours of bodies\n' > "$dir/prompts.txt"
"$sample" --checkpoint="$dir/one" --prompts_file="$dir/prompts.txt" --num_samples=2 \
  --max_new_tokens=20 --temperature=0 > "$dir/batch.txt" 2> "$dir/batch.err"
grep -q "^3 prompts: 3 to 17 tokens$" "$dir/batch.err"
grep -Eq "^generated 120 tokens, 6 rows, in" "$dir/batch.err"
[[ $(grep -c '^---------------$' "$dir/batch.txt") == 5 ]]
row=0
for prompt in "Light is" "Light is" "The" "The" "Colours of bodies" "Colours of bodies"; do
  row=$((row + 1))
  want=$("$sample" --checkpoint="$dir/one" --prompt="$prompt" --max_new_tokens=20 --temperature=0 \
         2> /dev/null)
  got=$(awk -v n=$row 'BEGIN { RS = "\n---------------\n" } NR == n { printf "%s", $0 }' "$dir/batch.txt")
  [[ "$got" == "${want%$'\n'}" ]] || { echo "row $row: '$got' is not '$want'"; exit 1; }
done
echo "3 prompts of 3, 8 and 17 bytes in one batch: each row as its prompt alone"

# Beam search (3 beams per prompt, Hugging Face's generate for GPT-2) on the
# same batch: one row per prompt, printed at the end; the same rows with the
# key/value cache (its rows reordered as beams move) and without; --eos_id
# ends a hypothesis at that byte.
"$sample" --checkpoint="$dir/one" --prompts_file="$dir/prompts.txt" --num_beams=3 \
  --max_new_tokens=20 --temperature=0 > "$dir/beams.txt" 2> "$dir/beams.err"
grep -qF "| 3 beams, greedy" "$dir/beams.err"
grep -Eq "^generated 60 tokens, 3 rows, in" "$dir/beams.err"
[[ $(grep -c '^---------------$' "$dir/beams.txt") == 2 ]]
"$sample" --checkpoint="$dir/one" --prompts_file="$dir/prompts.txt" --num_beams=3 \
  --max_new_tokens=20 --temperature=0 --nokv_cache 2> /dev/null | cmp - "$dir/beams.txt"
# This barely trained model writes "e" (101) over and over: with it as the
# eos, every hypothesis ends at its first "e".
"$sample" --checkpoint="$dir/one" --prompt_tokens=76,105 --num_beams=3 --max_new_tokens=20 \
  --temperature=0 --eos_id=101 --print=tokens 2> /dev/null > "$dir/eos.txt"
grep -Eq '^76 105( [0-9]+)* 101 $' "$dir/eos.txt"
[[ $(grep -o ' 101 ' "$dir/eos.txt" | wc -l) == 1 ]]
# --num_samples=2 with beams: each prompt's 2 best hypotheses, the best first
# (the 1-sample run's row).
"$sample" --checkpoint="$dir/one" --prompts_file="$dir/prompts.txt" --num_beams=3 --num_samples=2 \
  --max_new_tokens=20 --temperature=0 > "$dir/beams2.txt" 2> "$dir/beams2.err"
grep -qF "| 3 beams, greedy, 2 returned" "$dir/beams2.err"
[[ $(grep -c '^---------------$' "$dir/beams2.txt") == 5 ]]
for p in 1 2 3; do
  got=$(awk -v n=$((2 * p - 1)) 'BEGIN { RS = "\n---------------\n" } NR == n { print $0 }' "$dir/beams2.txt")
  want=$(awk -v n=$p 'BEGIN { RS = "\n---------------\n" } NR == n { print $0 }' "$dir/beams.txt")
  [[ "$got" == "$want" ]] || { echo "prompt $p: best of 2 '$got' is not '$want'"; exit 1; }
done
"$sample" --checkpoint="$dir/one" --prompt="Light is" --num_beams=2 --temperature=0.8 \
  --max_new_tokens=10 2> "$dir/sampled_beams.err" > /dev/null
grep -qF "| 2 beams, sampled" "$dir/sampled_beams.err"
echo "beam search: one row per prompt, the same with the cache and without, eos ends a hypothesis"

# Bad input: exit 2, the message names it.
expect_error() { exits_2 "$1" "$sample" "${@:2}"; }
expect_error "--checkpoint is required"
expect_error "--checkpoint: $dir/none: no such folder" --checkpoint="$dir/none"
expect_error "--temperature must be finite and >= 0" --checkpoint="$dir/one" --temperature=-1
expect_error "--top_p must be in (0, 1], got 1.5" --checkpoint="$dir/one" --top_p=1.5
expect_error "--top_k must be >= 0" --checkpoint="$dir/one" --top_k=-2
expect_error "--prompt_tokens='76,,105' has an empty entry" --checkpoint="$dir/one" \
  --prompt_tokens=76,,105
# Flags the decoding would not read.
expect_error "--top_k=5: it narrows the tokens a draw takes, but --temperature=0 draws none \
(greedy decoding): give --temperature > 0 to sample" --checkpoint="$dir/one" --temperature=0 \
  --top_k=5
expect_error "--top_k=5 --top_p=0.5: they narrow the tokens a draw takes, but --temperature=0 \
draws none (beam search by score)" --checkpoint="$dir/one" --temperature=0 --top_k=5 \
  --top_p=0.5 --num_beams=2
expect_error "--length_penalty=2: beam search's, but --num_beams=1 searches no beams: give \
--num_beams > 1" --checkpoint="$dir/one" --length_penalty=2
expect_error "--early_stopping=true: beam search's" --checkpoint="$dir/one" --early_stopping
# --top_k=0 keeps every token: nothing to ignore.
"$sample" --checkpoint="$dir/one" --prompt_tokens=76 --max_new_tokens=2 --temperature=0 \
  --top_k=0 > /dev/null 2>&1 || { echo "--temperature=0 --top_k=0 refused"; exit 1; }
expect_error "--repetition_penalty must be finite and > 0 (1: off), got -1" --checkpoint="$dir/one" \
  --repetition_penalty=-1
expect_error "--no_repeat_ngram_size must be >= 0 (0: off), got -3" --checkpoint="$dir/one" \
  --no_repeat_ngram_size=-3
expect_error "--num_samples must be >= 1, got 0" --checkpoint="$dir/one" --num_samples=0
expect_error "--num_samples=2147483648 with --max_new_tokens=" --checkpoint="$dir/one" \
  --num_samples=2147483648
expect_error "--num_beams=99999999999 with --max_new_tokens=" --checkpoint="$dir/one" \
  --num_beams=99999999999
expect_error "--max_new_tokens=99999999999: 1 prompt(s) x 1 row(s) x up to 1000000000" \
  --checkpoint="$dir/one" --max_new_tokens=99999999999
expect_error "--max_new_tokens=9223372036854775807: " --checkpoint="$dir/one" \
  --max_new_tokens=9223372036854775807
expect_error "--num_beams=0 must be >= 1" --checkpoint="$dir/one" --num_beams=0
expect_error "--num_samples=4 with beam search must be <= --num_beams=3" --checkpoint="$dir/one" \
  --num_beams=3 --num_samples=4
expect_error "--min_new_tokens=300 must be in [0, max_new_tokens=256]" --checkpoint="$dir/one" \
  --min_new_tokens=300
expect_error "--min_new_tokens=4: it holds off --eos_id, but --eos_id=-1 stops no row" \
  --checkpoint="$dir/one" --min_new_tokens=4
expect_error "--eos_id=256 is not an id of the vocabulary of 256 (nor -1)" --checkpoint="$dir/one" \
  --eos_id=256
expect_error "--prompt_tokens: '300' is not a token id in [0, 256)" --checkpoint="$dir/one" \
  --prompt_tokens=1,300
expect_error "--prompt is empty" --checkpoint="$dir/one" --prompt=
expect_error "--prompt_tokens takes the place of --prompt" --checkpoint="$dir/one" \
  --prompt="Light is" --prompt_tokens=1,2
expect_error "--print=words: expected text, tokens or auto" --checkpoint="$dir/one" --print=words
expect_error "--prompts_file takes the place of --prompt and --prompt_tokens" \
  --checkpoint="$dir/one" --prompts_file="$dir/prompts.txt" --prompt=x
expect_error "--prompts_file=$dir/nothing.txt: cannot read it" --checkpoint="$dir/one" \
  --prompts_file="$dir/nothing.txt"
printf '\n\n' > "$dir/blank.txt"
expect_error "--prompts_file=$dir/blank.txt holds no prompt (one per line)" \
  --checkpoint="$dir/one" --prompts_file="$dir/blank.txt"
expect_error "--checkpoint: $dir is neither a checkpoint nor a Hugging Face model folder (no config.json): $dir is not a checkpoint (no model.safetensors or index.json in it) nor a checkpoint directory (no 'latest' file)" --checkpoint="$dir"
# A model of token ids (vocabulary 512 on random data) wants ids, and prints ids.
"$train" --preset=gpt-nano --data=random --vocab_size=512 --steps=1 --seq_len=16 --batch_size=2 \
  --checkpoint_dir="$dir/ids" > /dev/null
expect_error "vocabulary is 512 token ids, not 256 bytes: name its tokenizer (--tokenizer=gpt2 for GPT-2's) or give the prompt as --prompt_tokens" \
  --checkpoint="$dir/ids"
expect_error "--print=text needs a byte-level model" --checkpoint="$dir/ids" --prompt_tokens=3 \
  --print=text
"$sample" --checkpoint="$dir/ids" --prompt_tokens=3 --max_new_tokens=4 2> /dev/null |
  grep -Eq '^3( [0-9]+){4} $'
echo "bad input exits 2 naming it"

# GPT-2 tokens: the shipped text through //tools:tokenize, a model trained on
# them, and text in and out through GPT-2's tokenizer.
"$tokenize" --input="$text" --output="$dir/opticks.bin" > /dev/null
"$train" --preset=gpt-nano --data="$dir/opticks.bin" --steps=2 --seq_len=32 --batch_size=4 \
  --log_every=2 --checkpoint_dir="$dir/bpe" > "$dir/bpe_train.out"
grep -qx "tokenizer: gpt2" "$dir/bpe_train.out"  # tokenize's record, opticks.bin.json
bpe=(--max_new_tokens=12 --seed=5)
"$sample" --checkpoint="$dir/bpe" --tokenizer=gpt2 --prompt="Light is" "${bpe[@]}" \
  > "$dir/bpe.txt" 2> "$dir/bpe.err"
grep -q "^tokenizer: GPT-2 BPE from .* (50257 ids) | prompt: 2 token[(]s[)]" "$dir/bpe.err"
[[ $(head -c 8 "$dir/bpe.txt") == "Light is" ]]
# The checkpoint records the tokenizer: no flag needed.
"$sample" --checkpoint="$dir/bpe" --prompt="Light is" "${bpe[@]}" 2> /dev/null | cmp - "$dir/bpe.txt"
echo "tokenize -> train -> sample: the tokenizer recorded at each step, text in and out unnamed"
# The prompt's ids (written by the tokenize tool) sample the same text, and
# --print=tokens prints them and 12 more.
printf 'Light is' > "$dir/prompt.txt"
"$tokenize" --input="$dir/prompt.txt" --output="$dir/prompt.bin" > /dev/null
ids=$(od -An -t u2 "$dir/prompt.bin" | tr -s ' ' | sed 's/^ //; s/ $//; s/ /,/g')
"$sample" --checkpoint="$dir/bpe" --tokenizer=gpt2 --prompt_tokens="$ids" "${bpe[@]}" 2> /dev/null |
  cmp - "$dir/bpe.txt"
"$sample" --checkpoint="$dir/bpe" --tokenizer=gpt2 --prompt="Light is" "${bpe[@]}" --print=tokens \
  2> /dev/null | grep -Eq "^${ids//,/ }( [0-9]+){12} \$"
# "<|endoftext|>" in a prompt is the special token (GPT-2's unconditional start).
"$sample" --checkpoint="$dir/bpe" --tokenizer=gpt2 --prompt="<|endoftext|>" "${bpe[@]}" \
  --print=tokens 2> "$dir/eot.err" | grep -Eq "^50256( [0-9]+){12} \$"
grep -qF "| prompt: 1 token(s)" "$dir/eot.err"
echo "GPT-2 tokens: --prompt text = its ids ($ids), text out; <|endoftext|> is 50256"
# Exported with the tokenizer, the Hugging Face folder samples the same text
# with no --tokenizer (its own vocab.json + merges.txt); none turns it off.
"$checkpoint" export-hf "$dir/bpe" "$dir/bpe_hf" > "$dir/export.out"  # the recorded one
grep -qF "(config.json, model.safetensors, vocab.json, merges.txt)" "$dir/export.out"
grep -qF '"eos_token_id": 50256' "$dir/bpe_hf/config.json"  # the tokenizer's <|endoftext|>
"$checkpoint" export-hf "$dir/bpe" "$dir/bpe_hf_bare" --tokenizer=none > "$dir/export.out"
grep -qF "(config.json, model.safetensors) of" "$dir/export.out"
grep -qF '"eos_token_id": null' "$dir/bpe_hf_bare/config.json"
"$sample" --checkpoint="$dir/bpe_hf" --prompt="Light is" "${bpe[@]}" 2> "$dir/hf_bpe.err" |
  cmp - "$dir/bpe.txt"
grep -qF "tokenizer: GPT-2 BPE from $dir/bpe_hf (50257 ids)" "$dir/hf_bpe.err"
"$sample" --checkpoint="$dir/bpe_hf" --tokenizer=none --prompt_tokens="$ids" "${bpe[@]}" \
  2> /dev/null | grep -Eq "^${ids//,/ }( [0-9]+){12} \$"
expect_error "--tokenizer=gpt2: its vocabulary has 50257 ids and the model's 256" \
  --checkpoint="$dir/one" --tokenizer=gpt2
expect_error "--tokenizer=$dir: $dir holds no GPT-2 tokenizer" --checkpoint="$dir/bpe" \
  --tokenizer="$dir"
exits_2 "its vocabulary has 50257 ids and the model's 256" \
  "$checkpoint" export-hf "$dir/one" "$dir/one_hf" --tokenizer=gpt2
[[ ! -e "$dir/one_hf" ]]
echo "export-hf --tokenizer: the folder samples text by itself; mismatched tokenizers refused"

# A tokenizer folder is recorded by its path; gone, it is named (none still
# samples ids). A stale record beside a token file, and a tokenizer for byte
# text, are refused by train.
mkdir -p "$dir/tok"
cp "$(dirname "$text")/../gpt2_tokenizer/"{vocab.json,merges.txt} "$dir/tok/"
"$tokenize" --input="$text" --output="$dir/folder.bin" --tokenizer="$dir/tok" > /dev/null
"$train" --preset=gpt-nano --data="$dir/folder.bin" --steps=1 --seq_len=8 --batch_size=1 \
  --checkpoint_dir="$dir/folder_ck" > "$dir/folder_train.out"
grep -qx "tokenizer: $dir/tok" "$dir/folder_train.out"
"$sample" --checkpoint="$dir/folder_ck" --prompt="Light is" "${bpe[@]}" 2> "$dir/folder.err" > /dev/null
grep -qF "tokenizer: GPT-2 BPE from $dir/tok (50257 ids)" "$dir/folder.err"
rm -r "$dir/tok"
expect_error "the tokenizer $dir/tok that checkpoint $dir/folder_ck/step_000001 (step 1) records: " \
  --checkpoint="$dir/folder_ck"
"$sample" --checkpoint="$dir/folder_ck" --tokenizer=none --prompt_tokens="$ids" "${bpe[@]}" \
  2> /dev/null | grep -Eq "^${ids//,/ }( [0-9]+){12} \$"
cp "$dir/prompt.bin.json" "$dir/stale.bin.json"
cp "$dir/opticks.bin" "$dir/stale.bin"
exits_2 "stale.bin.json records 2 tokens but $dir/stale.bin holds 147297: a record of another file" \
  "$train" --data="$dir/stale.bin" --steps=1
exits_2 "--tokenizer=gpt2 with --data=shipped: text data is read as bytes" \
  "$train" --data=shipped --tokenizer=gpt2 --steps=1
echo "a recorded tokenizer folder that went away is named; stale records and byte text refused"
