#!/usr/bin/env bash
# tools/spm_tokenize.py: a SentencePiece model trained here on the shipped text,
# with T5's special ids (pad 0, </s> 1, unk 2), encodes the text into a token
# file that decodes back to it and whose record gives //models/t5:train its
# vocabulary (300 ids + 100 sentinels); training on it runs with T5's </s>
# appended (--eos_id=1). Prompts go through it as lines of ids to
# //models/t5:generate (from the checkpoint and from its Hugging Face export,
# with the key/value cache and without: the same tokens; sampled: the seed's
# tokens every run; beam search, with the cache and without) and back to text. Bad input exits 2 naming the flag.
set -euo pipefail
script="$1"
train="$2"
text="$3"
source "$4"  # models/common/cli_testing.sh: exits_2
generate="$5"
checkpoint="$6"
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
"$generate" --init_from="$dir/ck" --input="$dir/ids.txt" --max_new_tokens=6 > "$dir/out.txt" \
  2> "$dir/generate.log"
grep -q "^model t5-tiny(vocab_size=400, .* from checkpoint $dir/ck/step_000002 (step 2)" \
  "$dir/generate.log"
grep -q "^3 examples, 18 tokens in " "$dir/generate.log"
[[ $(wc -l < "$dir/out.txt") == 3 ]]
awk '{ if (NF != 6) exit 1; for (i = 1; i <= NF; i++) if ($i !~ /^[0-9]+$/ || $i >= 400) exit 1 }' \
  "$dir/out.txt"
# The same ids apart by tabs, from stdin (--input=-): the same tokens.
tr ' ' '\t' < "$dir/ids.txt" | "$generate" --init_from="$dir/ck" --input=- --max_new_tokens=6 \
  2> /dev/null | cmp - "$dir/out.txt"
# Without the key/value cache: the same tokens. Sampled: a seed repeats its draws.
"$generate" --init_from="$dir/ck" --input="$dir/ids.txt" --max_new_tokens=6 --nokv_cache \
  2> /dev/null | cmp - "$dir/out.txt"
for run in 1 2; do
  "$generate" --init_from="$dir/ck" --input="$dir/ids.txt" --max_new_tokens=6 --temperature=1.5 \
    --top_k=50 --seed=3 > "$dir/sampled_$run.txt" 2> "$dir/sampled.log"
done
grep -q "| sampled$" "$dir/sampled.log"
cmp "$dir/sampled_1.txt" "$dir/sampled_2.txt"
# Beam search: the same ids with the cache and without; a line per example.
for cache in --kv_cache --nokv_cache; do
  "$generate" --init_from="$dir/ck" --input="$dir/ids.txt" --max_new_tokens=6 --num_beams=3 \
    --eos_id=1 "$cache" > "$dir/beams$cache.txt" 2> "$dir/beams.log"
done
grep -q "| 3 beams, greedy$" "$dir/beams.log"
cmp "$dir/beams--kv_cache.txt" "$dir/beams--nokv_cache.txt"
[[ $(wc -l < "$dir/beams--kv_cache.txt") == 3 ]]
# --num_return_sequences=2: two lines per example, the best first (the line above).
"$generate" --init_from="$dir/ck" --input="$dir/ids.txt" --max_new_tokens=6 --num_beams=3 \
  --eos_id=1 --num_return_sequences=2 > "$dir/beams2.txt" 2> "$dir/beams2.log"
grep -q "| 3 beams, greedy, 2 returned$" "$dir/beams2.log"
[[ $(wc -l < "$dir/beams2.txt") == 6 ]]
awk 'NR % 2 == 1' "$dir/beams2.txt" | cmp - "$dir/beams--kv_cache.txt"
# Sampled beams: the same ids with the cache and without, for one seed.
for cache in --kv_cache --nokv_cache; do
  "$generate" --init_from="$dir/ck" --input="$dir/ids.txt" --max_new_tokens=6 --num_beams=3 \
    --eos_id=1 --temperature=1.5 --top_k=50 --seed=3 "$cache" > "$dir/sbeams$cache.txt" \
    2> "$dir/sbeams.log"
done
grep -q "| 3 beams, sampled$" "$dir/sbeams.log"
cmp "$dir/sbeams--kv_cache.txt" "$dir/sbeams--nokv_cache.txt"
[[ $(wc -l < "$dir/sbeams--kv_cache.txt") == 3 ]]
# No pair of ids twice in a line (the decoder's start id 0 included), greedy or in beams.
for beams in 1 3; do
  "$generate" --init_from="$dir/ck" --input="$dir/ids.txt" --max_new_tokens=12 --num_beams=$beams \
    --no_repeat_ngram_size=2 --repetition_penalty=1.2 > "$dir/norepeat.txt" 2> "$dir/norepeat.log"
  grep -q ", repetition_penalty 1.2, no_repeat_ngram_size 2$" "$dir/norepeat.log"
  awk '{ delete seen; prev = 0; for (i = 1; i <= NF; i++) { if ((prev " " $i) in seen) exit 1;
         seen[prev " " $i] = 1; prev = $i } }' "$dir/norepeat.txt" ||
    { echo "a pair repeats ($beams beams):"; cat "$dir/norepeat.txt"; exit 1; }
done
"$checkpoint" export-hf "$dir/ck" "$dir/hf" > /dev/null
"$generate" --init_from="$dir/hf" --input="$dir/ids.txt" --max_new_tokens=6 2> /dev/null |
  cmp - "$dir/out.txt"
# Ids of the model's own vocabulary (no sentinels: those are above 300) decode to text lines.
awk '{ for (i = 1; i <= NF; i++) if ($i >= 300) $i = 2; print }' "$dir/out.txt" > "$dir/out300.txt"
[[ $(/usr/bin/python3 "$script" --model="$dir" --decode_lines="$dir/out300.txt" | wc -l) == 3 ]]
echo "prompts through //models/t5:generate and back to text"

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
exits_2 "--eos_id=400 is not an id of the vocabulary of 400" "$generate" --init_from="$dir/ck" \
  --input="$dir/ids.txt" --eos_id=400
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
