#!/usr/bin/python3
"""Goldens for //models/t5:spiece_tokenizer_test, from the Python side.

Trains a small SentencePiece model (T5's kind: unigram, nmt_nfkc
normalization, pad 0, </s> 1, unk 2) on the start of the shipped text, and
writes what tools/spm_tokenize.py's encode_text and decode_ids (which
python3-sentencepiece runs) give for a set of texts and ids, and the texts'
plain ids (a token file's, sentinels as text), so that the C++ tokenizer
(libsentencepiece) is held to them:

  spiece_goldens.py TEXT SPM_TOKENIZE_PY OUT.model OUT.json
"""

import importlib.util
import json
import os
import sys
import tempfile

import sentencepiece

SENTINELS = 100

# Texts: plain, whitespace runs and ends, NFKC (fullwidth, a ligature), a
# character the model lacks (unk), sentinels between text and at the ends,
# things that only look like sentinels, empty.
TEXTS = [
    "Light is refracted by the prism",
    "  Of   the colours\tof bodies  ",
    "\uff26\uff55\uff4c\uff4c width and the \ufb01rst ligature",
    "caf\u00e9 \u2603 snow",
    "The <extra_id_0> walks in <extra_id_1> park",
    "<extra_id_0>of prisms<extra_id_99>",
    "<extra_id_5> <extra_id_3>",
    "<extra_id_007> <extra_id_> <extra_id_2 x <extra_id_3>>",
    "",
]


def main(text_path, script_path, model_out, json_out):
    spec = importlib.util.spec_from_file_location("spm_tokenize", script_path)
    spm_tokenize = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(spm_tokenize)
    with open(text_path, "rb") as f:
        text = f.read(200000).decode("utf-8", errors="ignore")
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "in.txt"), "w", encoding="utf-8") as f:
            f.write(text)
        sentencepiece.SentencePieceTrainer.Train(
            input=os.path.join(d, "in.txt"), model_prefix=os.path.join(d, "spiece"),
            vocab_size=300, model_type="unigram", normalization_rule_name="nmt_nfkc",
            character_coverage=1.0, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
            num_threads=1, minloglevel=2)
        with open(os.path.join(d, "spiece.model"), "rb") as f:
            model = f.read()
    with open(model_out, "wb") as f:
        f.write(model)
    sp = sentencepiece.SentencePieceProcessor()
    sp.LoadFromSerializedProto(model)
    vocab = sp.GetPieceSize()
    encode = [[t, spm_tokenize.encode_text(sp, t, vocab, SENTINELS)] for t in TEXTS]
    # As the token file's text: "<extra_id_k>" is ordinary text there.
    plain = [[t, sp.EncodeAsIds(t)] for t in TEXTS]
    # Ids to decode: each encoding, with </s> and <pad> (control pieces) and
    # sentinels put in, and runs that start with and without a space piece.
    decode = []
    for _, ids in encode:
        for case in (ids, [0] + ids + [1], [vocab + SENTINELS - 1] + ids + [vocab]):
            decode.append([case, spm_tokenize.decode_ids(sp, case, vocab, SENTINELS)])
    words = sp.EncodeAsIds("of prisms")
    for case in ([vocab + SENTINELS - 1] + words[1:], words + [vocab + 5] + words, [2, 2]):
        decode.append([case, spm_tokenize.decode_ids(sp, case, vocab, SENTINELS)])
    with open(json_out, "w", encoding="utf-8") as f:
        json.dump({"pieces": vocab, "sentinels": SENTINELS, "eos_id": sp.eos_id(),
                   "encode": encode, "plain": plain, "decode": decode}, f, ensure_ascii=False)


if __name__ == "__main__":
    main(*sys.argv[1:])
