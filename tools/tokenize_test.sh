#!/usr/bin/env bash
# //tools:tokenize: the shipped text encodes to tiktoken's 147297 GPT-2 ids
# (the count //models/data:gpt2_tokenizer_test checks id by id), the same
# whether encoded whole or in 1000-byte parts on 1 or 3 threads; llm.c's format and
# --append_eot; the record of the tokenizer beside the file (raw.bin.json);
# bad input exits 2 naming it and writes nothing.
set -euo pipefail
tokenize="$1"
text="$2"
source "$3"  # models/common/cli_testing.sh: exits_2
dir="${TEST_TMPDIR}/tokenize"
mkdir -p "$dir"

"$tokenize" --input="$text" --output="$dir/raw.bin" > "$dir/raw.out"
cat "$dir/raw.out"
grep -q "^wrote 147297 tokens (tokenizer gpt2, vocab 50257) from 1 file(s), 567198 bytes, to $dir/raw.bin (raw uint16)" "$dir/raw.out"
[[ $(stat -c %s "$dir/raw.bin") == $((2 * 147297)) ]]
[[ $(cat "$dir/raw.bin.json") == '{"tokenizer": "gpt2", "vocab_size": 50257, "num_tokens": 147297}' ]]
for threads in 1 3; do
  "$tokenize" --input="$text" --output="$dir/parts.bin" --chunk_bytes=1000 --threads=$threads \
    > /dev/null
  cmp "$dir/raw.bin" "$dir/parts.bin"
done
echo "147297 tokens, whole = in 1000-byte parts, on 1 and 3 threads"

# llm.c: magic 20240520 = 0x01350c58, version 1, the count, then the same ids.
"$tokenize" --input="$text" --output="$dir/llmc.bin" --format=llmc > /dev/null
[[ $(od -An -t u4 -N 12 "$dir/llmc.bin" | tr -s ' ') == " 20240520 1 147297" ]]
cmp <(tail -c +1025 "$dir/llmc.bin") "$dir/raw.bin"
echo "llm.c header + the same ids"

# Two inputs with <|endoftext|> (50256) after each.
printf 'Hello world' > "$dir/a.txt"
"$tokenize" --input="$dir/a.txt,$dir/a.txt" --output="$dir/eot.bin" --append_eot > /dev/null
[[ $(od -An -t u2 "$dir/eot.bin" | tr -s ' ') == " 15496 995 50256 15496 995 50256" ]]
echo "--append_eot: 15496 995 50256 twice"

# --special_tokens: "<|endoftext|>" in the text is 50256 (tiktoken's ids for
# this text with allowed_special="all", //models/data:gpt2_tokenizer_test).
printf 'one story.<|endoftext|>Another story.' > "$dir/stories.txt"
"$tokenize" --input="$dir/stories.txt" --output="$dir/stories.bin" --special_tokens > /dev/null
[[ $(od -An -t u2 "$dir/stories.bin" | tr -s ' ') == " 505 1621 13 50256 6610 1621 13" ]]
"$tokenize" --input="$dir/stories.txt" --output="$dir/plain.bin" > /dev/null
if od -An -t u2 "$dir/plain.bin" | grep -qw 50256; then echo "an <|endoftext|> id in plain.bin"; exit 1; fi
echo "--special_tokens: <|endoftext|> in the text is 50256, else ordinary text"

# A tokenizer folder is recorded by its absolute path.
mkdir -p "$dir/tok"
cp "$(dirname "$text")/../gpt2_tokenizer/vocab.json" "$(dirname "$text")/../gpt2_tokenizer/merges.txt" "$dir/tok/"
(top=$PWD; cd "$dir" && "$top/$tokenize" --input=a.txt --output=folder.bin --tokenizer=tok > /dev/null)
[[ $(cat "$dir/folder.bin.json") == "{\"tokenizer\": \"$dir/tok\", \"vocab_size\": 50257, \"num_tokens\": 2}" ]]
echo "the record beside the file: the tokenizer (gpt2, or a folder's absolute path), vocab, tokens"

expect_error() { exits_2 "$1" "$tokenize" "${@:2}"; }
expect_error "--input is required" --output="$dir/x.bin"
expect_error "--input='$text,,$text' has an empty entry (entries are comma-separated)" \
  --input="$text,,$text" --output="$dir/x.bin"
expect_error "--output is required" --input="$text"
expect_error "--input: " --input="$text,$dir/none.txt" --output="$dir/x.bin"
expect_error "--threads must be >= 0, got -1" --input="$text" --output="$dir/x.bin" --threads=-1
expect_error "--format=u32: expected raw or llmc" --input="$text" --output="$dir/x.bin" --format=u32
expect_error "the tokenizer folder $dir/gone does not exist" --input="$text" \
  --output="$dir/x.bin" --tokenizer="$dir/gone"
expect_error "--tokenizer=$dir: $dir holds no GPT-2 tokenizer" --input="$text" --output="$dir/x.bin" \
  --tokenizer="$dir"
expect_error "--output: [token file] cannot create '$dir/no/such/dir/x.bin.tmp." \
  --input="$text" --output="$dir/no/such/dir/x.bin"
mkdir -p "$dir/a_folder"
expect_error "--output=$dir/a_folder is a folder; give the token file's path" \
  --input="$text" --output="$dir/a_folder"
[[ ! -e "$dir/x.bin" && ! -e "$dir/x.bin.json" ]]
cp "$dir/a.txt" "$dir/keep.txt"
expect_error "--output=$dir/keep.txt: $dir/keep.txt is the input, which writing it would destroy" \
  --input="$dir/keep.txt" --output="$dir/keep.txt"
cmp "$dir/a.txt" "$dir/keep.txt"  # the text is still there
# Nor its record (OUT.json) over the input, nor either over the tokenizer's files.
cp "$dir/a.txt" "$dir/keep.bin.json"
expect_error "--output=$dir/keep.bin (and its record $dir/keep.bin.json): $dir/keep.bin.json is the \
input" --input="$dir/keep.bin.json" --output="$dir/keep.bin"
cmp "$dir/a.txt" "$dir/keep.bin.json"
# The temporary file it writes first is its own (OUT.tmp.<pid>): an input at
# OUT.tmp, which an earlier writer's name cut to nothing while it was read,
# is read whole.
cp "$dir/a.txt" "$dir/keep2.bin.tmp"
"$tokenize" --input="$dir/keep2.bin.tmp" --output="$dir/keep2.bin" > /dev/null
cmp "$dir/a.txt" "$dir/keep2.bin.tmp"
"$tokenize" --input="$dir/a.txt" --output="$dir/keep3.bin" > /dev/null
cmp "$dir/keep2.bin" "$dir/keep3.bin"
cp -r "$dir/tok" "$dir/tok_copy"
expect_error "is the tokenizer's vocabulary, which writing it would destroy" --input="$text" \
  --output="$dir/tok_copy/vocab" --tokenizer="$dir/tok_copy"
expect_error "$dir/tok_copy/merges.txt is the tokenizer's merges" --input="$text" \
  --output="$dir/tok_copy/merges.txt" --tokenizer="$dir/tok_copy"
diff -r "$dir/tok" "$dir/tok_copy"
# The shipped tokenizer's files too (--tokenizer=gpt2, the default).
expect_error "is the tokenizer's vocabulary" --input="$text" \
  --output="$(dirname "$text")/../gpt2_tokenizer/vocab"
[[ ! -e "$dir/tok_copy/vocab" ]]
: > "$dir/empty.txt"
expect_error "holds no text (0 bytes): nothing to write" --input="$dir/empty.txt" \
  --output="$dir/empty.bin"
[[ ! -e "$dir/empty.bin" ]]
echo "bad input: exit 2, named, nothing written"
