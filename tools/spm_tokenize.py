#!/usr/bin/python3
"""Encodes text files with a SentencePiece model (T5's spiece.model) as a token file.

T5's tokenizer is SentencePiece, which //models/t5:generate runs in C++ for
text prompts (t5::SpieceTokenizer); for training data this script (Debian's
python3-sentencepiece) writes what //tools:tokenize writes for
GPT-2's BPE, a flat uint16 file of ids and beside it PATH.json
({"tokenizer": "sentencepiece:<model's absolute path>", "vocab_size": N,
"num_tokens": M}, data::TokenFileMeta), so that //models/t5:train --data=PATH
knows the vocabulary (T5's 32000 ids; the span corruption puts the 100
sentinels above them, <extra_id_0> = 32099, as in T5's vocabulary):

  /usr/bin/python3 tools/spm_tokenize.py --model /path/t5-small --input a.txt,b.txt \\
      --output /tmp/t5.bin
  ./bazelw run //models/t5:train -- --init_from=/path/t5-small --data=/tmp/t5.bin --eos_id=1

--model is a spiece.model file or a folder holding one (a Hugging Face T5
folder). Each input is encoded in parts of 2^20 characters run on to a line
end (SentencePiece treats a line end as a space; near-ties between
segmentations can still fall otherwise than in the whole text, as they depend
on where the input starts); //tools:tokenize --tokenizer=<spiece.model> cuts
alike and writes the same file. --eos_after_each appends the model's
end-of-sequence id after each input file (with --output_lines: after each line).
A file it would write (OUTPUT, OUTPUT.json, their .tmp) that is an input or
the model, by any path or link, is refused (exit 2): writing it would destroy it.

For //models/t5:generate --input, which takes and prints ids a line per example
(its --prompts_file and --print=text tokenize in C++ alike, with the same library):
--output_lines writes each line of the inputs that has text as a line of ids (with
--eos_after_each, each ends with the end-of-sequence id, as T5's inputs do),
and --decode_lines=FILE prints each line of ids of FILE as text: ids P .. P+S-1
above the model's P pieces are the S sentinels (--sentinels, default 100, as
//models/t5:train's --num_sentinels), <extra_id_0> = P+S-1 the highest, written
"<extra_id_k>" as Hugging Face's T5 tokenizer decodes them; --output_lines reads
"<extra_id_k>" in a line as that sentinel's id.

  /usr/bin/python3 tools/spm_tokenize.py --model /path/t5-small --input prompts.txt \
      --output /tmp/ids.txt --output_lines --eos_after_each
  ./bazelw run //models/t5:generate -- --init_from=/path/t5-small --input=/tmp/ids.txt \
      --eos_id=1 > /tmp/out.txt
  /usr/bin/python3 tools/spm_tokenize.py --model /path/t5-small --decode_lines /tmp/out.txt

Exit 2 naming the flag on bad input.
"""

import argparse
import json
import os
import re
import sys

import numpy as np

try:
    import sentencepiece
except ImportError:  # pragma: no cover - the message is the point
    sys.exit("spm_tokenize: needs Debian's python3-sentencepiece (./bazelw installs it)")

# Characters per part before it runs on to a line end. SentencePiece's ids
# depend on where the text is cut (near-ties are broken by scores summed from
# the input's start), so //tools:tokenize cuts its parts alike.
PART_CHARS = 1 << 20


def fail(message):
    print(f"spm_tokenize: error: {message}", file=sys.stderr)
    sys.exit(2)


def model_path(flag):
    path = os.path.join(flag, "spiece.model") if os.path.isdir(flag) else flag
    if not os.path.isfile(path):
        fail(f"--model={flag}: no such file (a spiece.model, or a folder holding one)")
    return os.path.abspath(path)


def same_file(a, b):
    """Whether paths a and b name one existing file (also through links or other paths)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # either does not exist: nothing there to overwrite
        return False


def refuse_overwriting_inputs(args, model, written):
    """Exit 2 if a file this run writes (`written`) is an input or the model."""
    for out in written:
        where = f"--output={args.output}" + ("" if out == args.output else f": {out}")
        for name in args.input.split(","):
            if same_file(out, name):
                fail(f"{where} is the input {name}: writing it would destroy the text")
        if same_file(out, model):
            fail(f"{where} is the model {model}: writing it would destroy the model")


def parts(text):
    """The text in pieces of about PART_CHARS characters, each ending at a line end
    (t5::SentencePiecePartEnd cuts alike)."""
    start = 0
    while start < len(text):
        end = text.find("\n", start + PART_CHARS)
        end = len(text) if end < 0 else end + 1
        yield text[start:end]
        start = end


SENTINEL = re.compile(r"<extra_id_(0|[1-9][0-9]*)>")


def encode_text(sp, text, vocab, sentinels):
    """The ids of text: each "<extra_id_k>" is sentinel k (id vocab + sentinels - 1 - k), the
    text between goes through the model, as Hugging Face's T5Tokenizer splits at its special
    tokens (//models/t5:generate --prompts_file encodes alike). ValueError naming a sentinel
    whose k is not below sentinels."""
    ids = []
    at = 0
    for m in SENTINEL.finditer(text):
        k = int(m.group(1))
        if k >= sentinels:
            raise ValueError(f"'{m.group(0)}' is a sentinel, and there are none" if not sentinels
                             else f"'{m.group(0)}' is not one of the {sentinels} sentinels "
                             f"(<extra_id_0> .. <extra_id_{sentinels - 1}>)")
        ids += sp.EncodeAsIds(text[at:m.start()]) + [vocab + sentinels - 1 - k]
        at = m.end()
    return ids + sp.EncodeAsIds(text[at:])


def decode_ids(sp, ids, vocab, sentinels):
    """The text of ids: runs of the model's ids through it, sentinel ids as "<extra_id_k>"."""
    out = ""
    run = []
    for i in ids + [None]:  # None: the end, which flushes the last run
        if i is not None and i < vocab:
            run.append(i)
            continue
        if run:
            text = sp.DecodeIds(run)
            # SentencePiece drops the space a first piece starts with; after a
            # sentinel it is the text's own (Hugging Face: "<extra_id_0> park").
            first = next((r for r in run if not sp.IsControl(r)), None)
            if out and text and first is not None and sp.IdToPiece(first).startswith("\u2581"):
                text = " " + text
            out += text
            run = []
        if i is not None:
            out += f"<extra_id_{vocab + sentinels - 1 - i}>"
    return out


def decode_lines(sp, path, vocab, sentinels):
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        fail(f"--decode_lines: {path}: {e}")
    for n, line in enumerate(lines, 1):
        try:
            ids = [int(t) for t in line.split()]
        except ValueError:
            fail(f"--decode_lines: {path}: line {n} is not ids separated by spaces")
        for i in ids:
            if i < 0 or i >= vocab + sentinels:
                fail(f"--decode_lines: {path}: line {n} has id {i}, outside 0 .. "
                     f"{vocab + sentinels - 1} (the model's {vocab} pieces and "
                     f"--sentinels={sentinels})")
        print(decode_ids(sp, ids, vocab, sentinels))


def encode_lines(sp, args):
    out = []
    for name in args.input.split(","):
        try:
            # Lines end at "\n" only (a "\r" before it is dropped), as
            # //models/t5:generate --prompts_file reads them.
            with open(name, encoding="utf-8", newline="") as f:
                lines = f.read().split("\n")
        except (OSError, UnicodeDecodeError) as e:
            fail(f"--input: {name}: {e}")
        if lines[-1] == "":
            lines.pop()
        for n, line in enumerate(lines, 1):
            line = line[:-1] if line.endswith("\r") else line
            try:
                ids = encode_text(sp, line, sp.GetPieceSize(), args.sentinels)
            except ValueError as e:
                fail(f"--input: {name}: line {n}: {e} (--sentinels={args.sentinels})")
            if ids:  # lines without text are skipped
                ids += [sp.eos_id()] if args.eos_after_each else []
                out.append(" ".join(map(str, ids)))
    try:
        with open(args.output, "w") as f:
            f.write("".join(line + "\n" for line in out))
    except OSError as e:
        fail(f"--output={args.output}: {e}")
    print(f"wrote {len(out)} lines of ids to {args.output}")


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="spiece.model, or a folder holding one")
    p.add_argument("--input", help="text files, comma-separated, in this order")
    p.add_argument("--output", help="the uint16 token file (and OUTPUT.json)")
    p.add_argument("--eos_after_each", action="store_true",
                   help="append the model's end-of-sequence id: in the token file once after "
                   "each input file (not after each line); with --output_lines at the end of "
                   "each line of ids")
    p.add_argument("--output_lines", action="store_true",
                   help="write each input line that has text as a line of ids (text) instead")
    p.add_argument("--decode_lines", default="",
                   help="print each line of ids of this file as text (no --input / --output)")
    p.add_argument("--sentinels", type=int, default=100,
                   help="with --decode_lines and --output_lines: ids P .. P+S-1 above the model's "
                   "P pieces are the S sentinels, <extra_id_k> for id P+S-1-k (as "
                   "//models/t5:train --num_sentinels; default %(default)s)")
    args = p.parse_args(argv)
    if not args.decode_lines and not (args.input and args.output):
        fail("--input and --output are required (or --decode_lines)")
    if args.sentinels < 0:
        fail(f"--sentinels={args.sentinels} must be >= 0")

    path = model_path(args.model)
    if not args.decode_lines:
        written = [args.output] if args.output_lines else [
            args.output, args.output + ".tmp", args.output + ".json", args.output + ".json.tmp"]
        refuse_overwriting_inputs(args, path, written)
    sp = sentencepiece.SentencePieceProcessor()
    try:
        sp.Load(path)
    except (OSError, RuntimeError) as e:
        fail(f"--model={args.model}: {path} is not a SentencePiece model ({e})")
    vocab = sp.GetPieceSize()
    if vocab > 65536:
        fail(f"--model={args.model}: {vocab} pieces do not fit uint16 ids")
    if args.eos_after_each and sp.eos_id() < 0:
        fail(f"--eos_after_each: {path} has no end-of-sequence piece")
    if args.decode_lines:
        decode_lines(sp, args.decode_lines, vocab, args.sentinels)
        return
    if args.output_lines:
        encode_lines(sp, args)
        return

    ids = []
    for name in args.input.split(","):
        try:
            # Line ends as they are ("\r" is a character, as //tools:tokenize
            # counts it): parts are cut at "\n" alone.
            with open(name, encoding="utf-8", newline="") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            fail(f"--input: {name}: {e}")
        for part in parts(text):
            ids.extend(sp.EncodeAsIds(part))
        if args.eos_after_each:
            ids.append(sp.eos_id())
    if not ids:
        fail(f"--input={args.input}: no tokens")

    # Written whole or not at all: a temporary name, then renamed.
    tmp = args.output + ".tmp"
    try:
        np.asarray(ids, dtype="<u2").tofile(tmp)
        os.replace(tmp, args.output)
        meta = {"tokenizer": "sentencepiece:" + path, "vocab_size": vocab, "num_tokens": len(ids)}
        with open(args.output + ".json.tmp", "w") as f:
            json.dump(meta, f)
        os.replace(args.output + ".json.tmp", args.output + ".json")
    except OSError as e:
        fail(f"--output={args.output}: {e}")
    print(f"wrote {len(ids)} tokens ({vocab} ids, {path}) to {args.output}")


if __name__ == "__main__":
    main(sys.argv[1:])
