#!/usr/bin/env bash
# tools/spm_tokenize.py: a SentencePiece model trained here on the shipped text,
# with T5's special ids (pad 0, </s> 1, unk 2), encodes the text into a token
# file that decodes back to it and whose record gives //models/t5:train its
# vocabulary (300 ids + 100 sentinels); training on it runs with T5's </s>
# appended (--eos_id=1). Prompts go through it as lines of ids to
# //models/t5:generate (from the checkpoint and from its Hugging Face export,
# with the key/value cache and without: the same tokens; sampled: the seed's
# tokens every run; beam search, with the cache and without) and back to text;
# the export carries the SentencePiece model (refused when it is not the
# data's); generate's own --prompts_file / --prompt and --print=text give the
# tool's ids (sentinels too, lines cut at "\n" alike) and text, from the
# checkpoint and from the export;
# ids above the model's 300 as the sentinels <extra_id_k> (399 the 0th). An output
# that is an input or the model (by any path, a link, or its OUTPUT.json) is
# refused and nothing is written; --help says where each mode puts --eos_after_each's
# </s>. Bad input exits 2 naming the flag.
set -euo pipefail
script="$1"
train="$2"
text="$3"
source "$4"  # models/common/cli_testing.sh: exits_2
generate="$5"
checkpoint="$6"
tokenize="$7"
dir="${TEST_TMPDIR}/spm"
mkdir -p "$dir"
head -c 200000 "$text" > "$dir/in.txt"
printf 'A second input.\n' > "$dir/second.txt"

/usr/bin/python3 - "$dir" <<'PY'
import sys
import sentencepiece
d = sys.argv[1]
sentencepiece.SentencePieceTrainer.Train(
    input=d + "/in.txt", model_prefix=d + "/spiece", vocab_size=300, model_type="unigram",
    character_coverage=1.0, pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2)
PY

# A folder holding spiece.model (as a Hugging Face T5 folder does).
/usr/bin/python3 "$script" --model="$dir" --input="$dir/in.txt,$dir/second.txt" \
  --output="$dir/t5.bin" --eos_after_each > "$dir/tokenize.log"
tokens=$(( $(stat -c %s "$dir/t5.bin") / 2 ))
grep -q "^wrote $tokens tokens (300 ids, $dir/spiece.model) to $dir/t5.bin" "$dir/tokenize.log"
grep -q "\"tokenizer\": \"sentencepiece:$dir/spiece.model\", \"vocab_size\": 300, \"num_tokens\": $tokens" \
  "$dir/t5.bin.json"
# The ids decode to the inputs (NFKC-normalized, whitespace collapsed: as
# SentencePiece normalizes text), each followed by </s>.
/usr/bin/python3 - "$dir" <<'PY'
import sys
import unicodedata
import numpy as np
import sentencepiece
d = sys.argv[1]
sp = sentencepiece.SentencePieceProcessor()
sp.Load(d + "/spiece.model")
ids = np.fromfile(d + "/t5.bin", dtype="<u2").tolist()
ends = [i for i, t in enumerate(ids) if t == 1]
assert len(ends) == 2 and ends[1] == len(ids) - 1, ends
for text_file, piece in (("/in.txt", ids[:ends[0]]), ("/second.txt", ids[ends[0] + 1:-1])):
    text = open(d + text_file, encoding="utf-8").read()
    want = " ".join(unicodedata.normalize("NFKC", text).split())
    got = " ".join(sp.DecodeIds(piece).split())
    assert got == want, (text_file, got[:200], want[:200])
print("the ids decode to both inputs, each followed by </s>")
PY
# //tools:tokenize with the model (libsentencepiece) writes the same file and
# record: by file or folder, on threads; past 2^20 characters in parts cut
# where the Python tool cuts (SentencePiece's ids depend on the cuts: a cut
# after 2^20 bytes of this text, not characters, changes them).
"$tokenize" --tokenizer="$dir/spiece.model" --input="$dir/in.txt,$dir/second.txt" \
  --output="$dir/cc.bin" --append_eot > "$dir/cc.log"
cmp "$dir/t5.bin" "$dir/cc.bin"
# The same record (the C++ one ends with a line end).
[[ "$(cat "$dir/t5.bin.json")" == "$(cat "$dir/cc.bin.json")" ]] ||
  { cat "$dir/t5.bin.json" "$dir/cc.bin.json"; exit 1; }
"$tokenize" --tokenizer="$dir" --input="$dir/in.txt,$dir/second.txt" --output="$dir/cc2.bin" \
  --append_eot --threads=3 > /dev/null
cmp "$dir/t5.bin" "$dir/cc2.bin"
[[ "$(cat "$dir/t5.bin.json")" == "$(cat "$dir/cc2.bin.json")" ]]
for i in 1 2 3 4; do sed 's/the /thé /g; s/of /öf /g' "$text"; done > "$dir/long.txt"
/usr/bin/python3 "$script" --model="$dir" --input="$dir/long.txt" --output="$dir/long_py.bin" \
  > /dev/null
"$tokenize" --tokenizer="$dir" --input="$dir/long.txt" --output="$dir/long_cc.bin" --threads=2 \
  > /dev/null
cmp "$dir/long_py.bin" "$dir/long_cc.bin"
# CRLF line ends (a character each, for both) and a lone CR.
sed 's/$/\r/' "$dir/long.txt" > "$dir/crlf.txt"
printf 'Of prisms\rand light\r' >> "$dir/crlf.txt"
/usr/bin/python3 "$script" --model="$dir" --input="$dir/crlf.txt" --output="$dir/crlf_py.bin" \
  > /dev/null
"$tokenize" --tokenizer="$dir" --input="$dir/crlf.txt" --output="$dir/crlf_cc.bin" > /dev/null
cmp "$dir/crlf_py.bin" "$dir/crlf_cc.bin"
printf '  \n\t\n' > "$dir/blank_in.txt"
exits_2 "--input: $dir/blank_in.txt gives no tokens" "$tokenize" --tokenizer="$dir" \
  --input="$dir/blank_in.txt" --output="$dir/bad.bin"
exits_2 "--input=$dir/blank_in.txt: no tokens" /usr/bin/python3 "$script" --model="$dir" \
  --input="$dir/blank_in.txt" --output="$dir/bad.bin"
exits_2 "--tokenizer=sentencepiece:: names no file" "$tokenize" --tokenizer=sentencepiece: \
  --input="$dir/second.txt" --output="$dir/bad.bin"
"$tokenize" --tokenizer="sentencepiece:$dir/spiece.model" --input="$dir/second.txt" \
  --output="$dir/cc3.bin" > /dev/null
/usr/bin/python3 "$script" --model="$dir/spiece.model" --input="$dir/second.txt" \
  --output="$dir/py3.bin" > /dev/null
cmp "$dir/py3.bin" "$dir/cc3.bin"
printf 'Light \xe9\n' > "$dir/latin1_in.txt"
exits_2 "--input: $dir/latin1_in.txt: byte 7 does not begin a UTF-8 character" \
  "$tokenize" --tokenizer="$dir" --input="$dir/latin1_in.txt" --output="$dir/bad.bin"
exits_2 "--special_tokens: <|endoftext|> is GPT-2's" "$tokenize" --tokenizer="$dir" \
  --input="$dir/second.txt" --output="$dir/bad.bin" --special_tokens
exits_2 "--tokenizer=$dir/in.txt.model: $dir/in.txt.model: no such file" "$tokenize" \
  --tokenizer="$dir/in.txt.model" --input="$dir/second.txt" --output="$dir/bad.bin"
[[ ! -e "$dir/bad.bin" && ! -e "$dir/bad.bin.tmp" ]]
echo "//tools:tokenize writes the same token file with the model"

"$train" --data="$dir/t5.bin" --eos_id=1 --steps=2 --batch_size=2 --encoder_length=32 \
  --log_every=1 --checkpoint_dir="$dir/ck" > "$dir/train.log"
grep -q "vocab 300 + 100 sentinels" "$dir/train.log"
grep -Eq "^step +2 \| loss [0-9.]+ " "$dir/train.log"
echo "//models/t5:train trains on it"

# Prompts as lines of ids (each ending with </s>), decoded by the trained
# model, from its checkpoint and from its Hugging Face export alike.
printf 'Light is refracted\n\nThe colours of bodies\nOf prisms\n' > "$dir/prompts.txt"
/usr/bin/python3 "$script" --model="$dir" --input="$dir/prompts.txt" --output="$dir/ids.txt" \
  --output_lines --eos_after_each > /dev/null
[[ $(wc -l < "$dir/ids.txt") == 3 ]]  # the empty line is skipped
[[ $(awk '{ print $NF }' "$dir/ids.txt" | sort -u) == 1 ]]
"$generate" --init_from="$dir/ck" --input="$dir/ids.txt" --max_new_tokens=6 --eos_id=-1 \
  > "$dir/out.txt" 2> "$dir/generate.log"
grep -q "^model t5-tiny(vocab_size=400, .* from checkpoint $dir/ck/step_000002 (step 2)" \
  "$dir/generate.log"
grep -q "^3 examples, 18 tokens in " "$dir/generate.log"
[[ $(wc -l < "$dir/out.txt") == 3 ]]
awk '{ if (NF != 6) exit 1; for (i = 1; i <= NF; i++) if ($i !~ /^[0-9]+$/ || $i >= 400) exit 1 }' \
  "$dir/out.txt"
# The special ids default to the weights': the checkpoint's batches ended with </s> (1).
"$generate" --init_from="$dir/ck" --input="$dir/ids.txt" --max_new_tokens=6 > "$dir/auto.txt" \
  2> "$dir/auto.log"
grep -q "| eos 1, pad 0, decoder start 0$" "$dir/auto.log" || { cat "$dir/auto.log"; exit 1; }
"$generate" --init_from="$dir/ck" --input="$dir/ids.txt" --max_new_tokens=6 --eos_id=1 \
  2> /dev/null | cmp - "$dir/auto.txt"
# A byte-level run's batches end without one: no eos.
"$train" --steps=1 --batch_size=2 --encoder_length=32 --checkpoint_dir="$dir/bytes" > /dev/null
"$generate" --init_from="$dir/bytes" --input="$dir/ids.txt" --max_new_tokens=2 2> "$dir/auto.log" \
  > /dev/null
grep -q "| eos -1, pad 0, decoder start 0$" "$dir/auto.log" || { cat "$dir/auto.log"; exit 1; }
# There --min_new_tokens holds off nothing: refused, saying --eos_id=auto is -1 (exit 2).
if "$generate" --init_from="$dir/bytes" --input="$dir/ids.txt" --min_new_tokens=2 \
    > /dev/null 2> "$dir/min.log"; then echo "--min_new_tokens without an eos ran"; exit 1; fi
grep -q -- "--eos_id=auto is -1 here (the weights record no eos id)" "$dir/min.log" ||
  { cat "$dir/min.log"; exit 1; }
# The same ids apart by tabs, from stdin (--input=-): the same tokens.
tr ' ' '\t' < "$dir/ids.txt" | "$generate" --init_from="$dir/ck" --input=- --max_new_tokens=6 \
  --eos_id=-1 2> /dev/null | cmp - "$dir/out.txt"
# Without the key/value cache: the same tokens. Sampled: a seed repeats its draws.
"$generate" --init_from="$dir/ck" --input="$dir/ids.txt" --max_new_tokens=6 --nokv_cache \
  --eos_id=-1 2> /dev/null | cmp - "$dir/out.txt"
for run in 1 2; do
  "$generate" --init_from="$dir/ck" --input="$dir/ids.txt" --max_new_tokens=6 --temperature=1.5 \
    --top_k=50 --seed=3 > "$dir/sampled_$run.txt" 2> "$dir/sampled.log"
done
grep -q "| sampled |" "$dir/sampled.log"
cmp "$dir/sampled_1.txt" "$dir/sampled_2.txt"
# Beam search: the same ids with the cache and without; a line per example.
for cache in --kv_cache --nokv_cache; do
  "$generate" --init_from="$dir/ck" --input="$dir/ids.txt" --max_new_tokens=6 --num_beams=3 \
    --eos_id=1 "$cache" > "$dir/beams$cache.txt" 2> "$dir/beams.log"
done
grep -q "| 3 beams, greedy |" "$dir/beams.log"
cmp "$dir/beams--kv_cache.txt" "$dir/beams--nokv_cache.txt"
[[ $(wc -l < "$dir/beams--kv_cache.txt") == 3 ]]
# --num_return_sequences=2: two lines per example, the best first (the line above).
"$generate" --init_from="$dir/ck" --input="$dir/ids.txt" --max_new_tokens=6 --num_beams=3 \
  --eos_id=1 --num_return_sequences=2 > "$dir/beams2.txt" 2> "$dir/beams2.log"
grep -q "| 3 beams, greedy, 2 returned |" "$dir/beams2.log"
[[ $(wc -l < "$dir/beams2.txt") == 6 ]]
awk 'NR % 2 == 1' "$dir/beams2.txt" | cmp - "$dir/beams--kv_cache.txt"
# Sampled beams: the same ids with the cache and without, for one seed.
for cache in --kv_cache --nokv_cache; do
  "$generate" --init_from="$dir/ck" --input="$dir/ids.txt" --max_new_tokens=6 --num_beams=3 \
    --eos_id=1 --temperature=1.5 --top_k=50 --seed=3 "$cache" > "$dir/sbeams$cache.txt" \
    2> "$dir/sbeams.log"
done
grep -q "| 3 beams, sampled |" "$dir/sbeams.log"
cmp "$dir/sbeams--kv_cache.txt" "$dir/sbeams--nokv_cache.txt"
[[ $(wc -l < "$dir/sbeams--kv_cache.txt") == 3 ]]
# No pair of ids twice in a line (the decoder's start id 0 included), greedy or in beams.
for beams in 1 3; do
  "$generate" --init_from="$dir/ck" --input="$dir/ids.txt" --max_new_tokens=12 --num_beams=$beams \
    --no_repeat_ngram_size=2 --repetition_penalty=1.2 > "$dir/norepeat.txt" 2> "$dir/norepeat.log"
  grep -q ", repetition_penalty 1.2, no_repeat_ngram_size 2 |" "$dir/norepeat.log"
  awk '{ delete seen; prev = 0; for (i = 1; i <= NF; i++) { if ((prev " " $i) in seen) exit 1;
         seen[prev " " $i] = 1; prev = $i } }' "$dir/norepeat.txt" ||
    { echo "a pair repeats ($beams beams):"; cat "$dir/norepeat.txt"; exit 1; }
done
"$checkpoint" export-hf "$dir/ck" "$dir/hf" > "$dir/export.log"
# With the SentencePiece model the data was encoded with (the checkpoint
# records it), and the sentinels for Hugging Face's T5Tokenizer.
grep -q "spiece.model (300 pieces, from $dir/spiece.model), tokenizer_config.json (100 sentinels)" \
  "$dir/export.log" || { cat "$dir/export.log"; exit 1; }
cmp "$dir/hf/spiece.model" "$dir/spiece.model"
grep -q '"extra_ids": 100' "$dir/hf/tokenizer_config.json"
grep -q '"eos_token": "</s>"' "$dir/hf/tokenizer_config.json"
grep -q '"pad_token": "<pad>"' "$dir/hf/tokenizer_config.json"
grep -q '"unk_token": "<unk>"' "$dir/hf/tokenizer_config.json"
exits_2 "--tokenizer=gpt2: GPT-2's BPE is minGPT's" \
  "$checkpoint" export-hf "$dir/ck" "$dir/hf_bad" --tokenizer=gpt2
/usr/bin/python3 -c "import sentencepiece, sys; sp = sentencepiece.SentencePieceProcessor();
sp.Load(sys.argv[1] + '/spiece.model'); assert sp.GetPieceSize() == 300" "$dir/hf"
"$checkpoint" export-hf "$dir/ck" "$dir/hf_plain" --tokenizer=none > /dev/null
[[ ! -e "$dir/hf_plain/spiece.model" ]]
# Another tokenizer than the data's, or a file that is no SentencePiece model: refused
# before anything is written. A byte-level run's checkpoint exports without one.
exits_2 "--tokenizer=$dir/in.txt: $dir/in.txt is not a SentencePiece model" \
  "$checkpoint" export-hf "$dir/ck" "$dir/hf_bad" --tokenizer="$dir/in.txt"
exits_2 "--tokenizer=$dir: $dir/spiece.model has 300 pieces, but the data of" \
  "$checkpoint" export-hf "$dir/bytes" "$dir/hf_bad" --tokenizer="$dir"
[[ ! -e "$dir/hf_bad" ]]
"$checkpoint" export-hf "$dir/bytes" "$dir/hf_bytes" > /dev/null
[[ ! -e "$dir/hf_bytes/spiece.model" ]]
"$generate" --init_from="$dir/hf" --input="$dir/ids.txt" --max_new_tokens=6 --eos_id=-1 \
  2> /dev/null | cmp - "$dir/out.txt"
# Its config.json records the same special ids, which generate takes by default.
"$generate" --init_from="$dir/hf" --input="$dir/ids.txt" --max_new_tokens=6 2> "$dir/auto.log" |
  cmp - "$dir/auto.txt"
grep -q "| eos 1, pad 0, decoder start 0$" "$dir/auto.log"
# generate's ids (the 300 of the model and 100 sentinels) decode to text lines.
[[ $(/usr/bin/python3 "$script" --model="$dir" --decode_lines="$dir/out.txt" | wc -l) == 3 ]]
echo "prompts through //models/t5:generate and back to text"
# Sentinels as the span corruption numbers them (span_corruption.h: <extra_id_k> = 400 - 1 - k),
# written as Hugging Face's T5 tokenizer writes them, with the text's own spaces.
printf 'of prisms\nLight is\n' > "$dir/spans.txt"
/usr/bin/python3 "$script" --model="$dir" --input="$dir/spans.txt" --output="$dir/spans_ids.txt" \
  --output_lines > /dev/null
printf '399 %s 398 %s 300\n%s 399 1\n' "$(sed -n 1p "$dir/spans_ids.txt")" \
  "$(sed -n 2p "$dir/spans_ids.txt")" "$(sed -n 1p "$dir/spans_ids.txt")" > "$dir/spans_out.txt"
/usr/bin/python3 "$script" --model="$dir" --decode_lines="$dir/spans_out.txt" > "$dir/spans.log"
printf '<extra_id_0> of prisms<extra_id_1> Light is<extra_id_99>\nof prisms<extra_id_0>\n' |
  cmp - "$dir/spans.log" || { echo "sentinels decoded as:"; cat "$dir/spans.log"; exit 1; }
echo "sentinel ids decode as <extra_id_k>"

printf 'Light is refracted\nThe colours of bodies\nOf prisms\n' > "$dir/text.txt"
# Asking for more than memory holds (a cache of petabytes, more than any mmap
# reserves whatever the overcommit setting; under ASan, a refusal too): the
# error, then the flags that ask for less.
rc=0
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}allocator_may_return_null=1" \
  "$generate" --init_from="$dir/ck" --prompts_file="$dir/text.txt" \
  --max_new_tokens=10000000000000 --eos_id=-1 > /dev/null 2> "$dir/oom.log" || rc=$?
[[ $rc == 1 ]] && grep -q "^generate: error: .*out of memory" "$dir/oom.log" &&
  grep -q "^generate: every example decodes at once .*--max_new_tokens" "$dir/oom.log" ||
  { echo "exit $rc"; cat "$dir/oom.log"; exit 1; }

# Text through //models/t5:generate itself (t5::SpieceTokenizer, libsentencepiece):
# the ids and the text the Python tool gives, with the tokenizer the checkpoint
# records and with its export's spiece.model and extra_ids.
gen_text=("$generate" --max_new_tokens=6 --eos_id=-1)
"${gen_text[@]}" --init_from="$dir/ck" --prompts_file="$dir/text.txt" --print=ids \
  2> "$dir/text.log" | cmp - "$dir/out.txt"
grep -q "^tokenizer $dir/spiece.model: 300 pieces + 100 sentinels, text in$" "$dir/text.log"
# What the encoder read: the Python tool's ids of the first line, </s> ended.
grep -qx "example 1 as ids: $(sed -n 1p "$dir/ids.txt")" "$dir/text.log" ||
  { cat "$dir/text.log"; head -1 "$dir/ids.txt"; exit 1; }
/usr/bin/python3 "$script" --model="$dir" --decode_lines="$dir/out.txt" > "$dir/out_text.txt"
"${gen_text[@]}" --init_from="$dir/ck" --prompts_file="$dir/text.txt" 2> "$dir/text.log" |
  cmp - "$dir/out_text.txt"
grep -q "^tokenizer $dir/spiece.model: 300 pieces + 100 sentinels, text in and out$" \
  "$dir/text.log"
"${gen_text[@]}" --init_from="$dir/hf" --prompts_file="$dir/text.txt" 2> "$dir/text.log" |
  cmp - "$dir/out_text.txt"
grep -q "^tokenizer $dir/hf/spiece.model: 300 pieces + 100 sentinels" "$dir/text.log"
"${gen_text[@]}" --init_from="$dir/ck" --input="$dir/ids.txt" --print=text 2> /dev/null |
  cmp - "$dir/out_text.txt"
"${gen_text[@]}" --init_from="$dir/ck" --prompt="Of prisms" 2> /dev/null |
  cmp - <(sed -n 3p "$dir/out_text.txt")
# Sentinels in the text are their ids, as the Python tool reads them.
printf 'Light <extra_id_0> refracted <extra_id_1>\n' > "$dir/span_text.txt"
/usr/bin/python3 "$script" --model="$dir" --input="$dir/span_text.txt" \
  --output="$dir/span_text_ids.txt" --output_lines --eos_after_each > /dev/null
grep -q " 399 .* 398 1$" "$dir/span_text_ids.txt"
"${gen_text[@]}" --init_from="$dir/ck" --input="$dir/span_text_ids.txt" 2> /dev/null \
  > "$dir/span_text_out.txt"
"${gen_text[@]}" --init_from="$dir/ck" --prompts_file="$dir/span_text.txt" --print=ids \
  2> "$dir/text.log" | cmp - "$dir/span_text_out.txt"
grep -qx "example 1 as ids: $(cat "$dir/span_text_ids.txt")" "$dir/text.log"
# Lines end at "\n" alone in both (a "\r" before it dropped): a form feed is text.
printf 'Of prisms\r\nLight\fis\n' > "$dir/ends.txt"
/usr/bin/python3 "$script" --model="$dir" --input="$dir/ends.txt" --output="$dir/ends_ids.txt" \
  --output_lines --eos_after_each > /dev/null
[[ $(wc -l < "$dir/ends_ids.txt") == 2 ]]
"${gen_text[@]}" --init_from="$dir/ck" --input="$dir/ends_ids.txt" 2> /dev/null \
  > "$dir/ends_out.txt"
"${gen_text[@]}" --init_from="$dir/ck" --prompts_file="$dir/ends.txt" --print=ids 2> /dev/null |
  cmp - "$dir/ends_out.txt"
exits_2 "--prompt needs a tokenizer, but checkpoint $dir/bytes/step_000001 (step 1) has none \
(--tokenizer=auto): give --tokenizer=<spiece.model or a folder holding one>" "$generate" \
  --init_from="$dir/bytes" --prompt="Of prisms"
exits_2 "--print=text needs a tokenizer, but --tokenizer=none" "$generate" \
  --init_from="$dir/ck" --input="$dir/ids.txt" --print=text --tokenizer=none
exits_2 "--tokenizer=$dir/in.txt: $dir/in.txt is not a SentencePiece model" "$generate" \
  --init_from="$dir/ck" --prompt="Of prisms" --tokenizer="$dir/in.txt"
printf 'Of prisms\n \n' > "$dir/blank.txt"
exits_2 "--prompts_file=$dir/blank.txt: line 2: it has no text" "$generate" \
  --init_from="$dir/ck" --prompts_file="$dir/blank.txt"
exits_2 "--prompt: '<extra_id_100>' is not one of the 100 sentinels (<extra_id_0> .. \
<extra_id_99>)" "$generate" --init_from="$dir/ck" --prompt="Of <extra_id_100>"
exits_2 "--input: $dir/span_text.txt: line 1: '<extra_id_1>' is not one of the 1 sentinels" \
  /usr/bin/python3 "$script" --model="$dir" --input="$dir/span_text.txt" --sentinels=1 \
  --output="$dir/x.txt" --output_lines
exits_2 "examples given twice: give one of --prompt, --prompts_file (text) and --input (ids)" \
  "$generate" --init_from="$dir/ck" --input="$dir/ids.txt" --prompt="Of prisms"
exits_2 "no examples: give one of" "$generate" --init_from="$dir/ck"
exits_2 "--print=words is not text, ids or auto" "$generate" --init_from="$dir/ck" \
  --input="$dir/ids.txt" --print=words
exits_2 "--tokenizer=$dir: nothing is tokenized here (--input gives ids and --print=ids prints \
ids)" "$generate" --init_from="$dir/ck" --input="$dir/ids.txt" --tokenizer="$dir"
printf 'Of prisms\nLight \xe9\n' > "$dir/latin1.txt"
exits_2 "--prompts_file=$dir/latin1.txt: line 2: it is not UTF-8 text (byte 7 does not begin a \
character)" "$generate" --init_from="$dir/ck" --prompts_file="$dir/latin1.txt"
echo "text through //models/t5:generate: the Python tool's ids and text"

# --help says what --eos_after_each appends in each mode (as checked above: one </s>
# after each of the two files in the token file, one after each line of ids).
help=$(COLUMNS=100 /usr/bin/python3 "$script" --help | tr -s ' \n' '  ')
[[ "$help" == *"id: in the token file once after each input file (not after each line); with \
--output_lines at the end of each line of ids"* ]] || { echo "--help: $help"; exit 1; }

# An output that is an input is refused (by its path, another path to it or a link; with
# --output_lines too; OUTPUT.json and the temporary files as well), as is the model.
cp "$dir/second.txt" "$dir/keep.txt"
cp "$dir/second.txt" "$dir/notes.json"
cp "$dir/spiece.model" "$dir/spiece.copy"
ln -s keep.txt "$dir/keep_link.txt"
ln -s keep.txt "$dir/notes.tmp"  # the token file's temporary name, a link to an input
destroys="writing it would destroy the text"
exits_2 "--output=$dir/keep.txt is the input $dir/keep.txt: $destroys" /usr/bin/python3 \
  "$script" --model="$dir" --input="$dir/keep.txt" --output="$dir/keep.txt"
exits_2 "--output=$dir/ck/../keep.txt is the input $dir/keep.txt: $destroys" /usr/bin/python3 \
  "$script" --model="$dir" --input="$dir/in.txt,$dir/keep.txt" --output="$dir/ck/../keep.txt"
exits_2 "--output=$dir/keep_link.txt is the input $dir/keep.txt: $destroys" /usr/bin/python3 \
  "$script" --model="$dir" --input="$dir/keep.txt" --output="$dir/keep_link.txt" --output_lines
exits_2 "--output=$dir/keep.txt is the input $dir/keep_link.txt: $destroys" /usr/bin/python3 \
  "$script" --model="$dir" --input="$dir/keep_link.txt" --output="$dir/keep.txt" --output_lines
exits_2 "--output=$dir/notes: $dir/notes.json is the input $dir/notes.json: $destroys" \
  /usr/bin/python3 "$script" --model="$dir" --input="$dir/notes.json" --output="$dir/notes"
exits_2 "--output=$dir/notes: $dir/notes.tmp is the input $dir/keep.txt: $destroys" \
  /usr/bin/python3 "$script" --model="$dir" --input="$dir/keep.txt" --output="$dir/notes"
exits_2 "--output=$dir/spiece.model is the model $dir/spiece.model: writing it would destroy the \
model" /usr/bin/python3 "$script" --model="$dir" --input="$dir/keep.txt" \
  --output="$dir/spiece.model" --output_lines
cmp "$dir/keep.txt" "$dir/second.txt"
cmp "$dir/notes.json" "$dir/second.txt"
cmp "$dir/spiece.model" "$dir/spiece.copy"
[[ ! -e "$dir/notes" ]]
echo "an output that is an input is refused, the input kept"

exits_2 "--model=$dir/none: no such file" /usr/bin/python3 "$script" --model="$dir/none" \
  --input="$dir/in.txt" --output="$dir/x.bin"
exits_2 "--model=$dir/in.txt: $dir/in.txt is not a SentencePiece model" /usr/bin/python3 \
  "$script" --model="$dir/in.txt" --input="$dir/in.txt" --output="$dir/x.bin"
exits_2 "--input: $dir/none.txt" /usr/bin/python3 "$script" --model="$dir" \
  --input="$dir/none.txt" --output="$dir/x.bin"
exits_2 "eos_id 300" "$train" --data="$dir/t5.bin" --eos_id=300 --steps=1
exits_2 "--decode_lines: $dir/prompts.txt: line 1 is not ids" /usr/bin/python3 "$script" \
  --model="$dir" --decode_lines="$dir/prompts.txt"
printf '5 7\n5 400\n' > "$dir/bad_ids.txt"
exits_2 "--input=$dir/bad_ids.txt: line 2: '400' is not an id below the model's 400" "$generate" \
  --init_from="$dir/ck" --input="$dir/bad_ids.txt"
exits_2 "--decode_lines: $dir/bad_ids.txt: line 2 has id 400, outside 0 .. 399 (the model's 300 \
pieces and --sentinels=100)" /usr/bin/python3 "$script" --model="$dir" \
  --decode_lines="$dir/bad_ids.txt"
exits_2 "--decode_lines: $dir/spans_out.txt: line 1 has id 399, outside 0 .. 299" /usr/bin/python3 \
  "$script" --model="$dir" --decode_lines="$dir/spans_out.txt" --sentinels=0
exits_2 "--sentinels=-1 must be >= 0" /usr/bin/python3 "$script" --model="$dir" \
  --decode_lines="$dir/spans_out.txt" --sentinels=-1
exits_2 "--eos_id=400 is not an id of the vocabulary of 400" "$generate" --init_from="$dir/ck" \
  --input="$dir/ids.txt" --eos_id=400
exits_2 "--pad_id='x' is not an id or auto" "$generate" --init_from="$dir/ck" \
  --input="$dir/ids.txt" --pad_id=x
exits_2 "--top_k=5: it narrows the tokens a draw takes, but --temperature=0 draws none" \
  "$generate" --init_from="$dir/ck" --input="$dir/ids.txt" --top_k=5
exits_2 "--top_p must be in (0, 1], got 0" "$generate" --init_from="$dir/ck" \
  --input="$dir/ids.txt" --temperature=1 --top_p=0
exits_2 "--no_repeat_ngram_size must be >= 0 (0: off), got -1" "$generate" --init_from="$dir/ck" \
  --input="$dir/ids.txt" --no_repeat_ngram_size=-1
exits_2 "--num_beams=0 must be >= 1" "$generate" --init_from="$dir/ck" --input="$dir/ids.txt" \
  --num_beams=0
exits_2 "--num_return_sequences=4 must be in [1, num_beams=3]" "$generate" --init_from="$dir/ck" \
  --input="$dir/ids.txt" --num_beams=3 --num_return_sequences=4
exits_2 "--init_from=$dir/none: " "$generate" --init_from="$dir/none" --input="$dir/ids.txt"
echo PASS
