// Encodes text files as a token file for training (nanoGPT's prepare.py):
//
//   ./bazelw run //tools:tokenize -- --input=/path/input.txt --output=/tmp/train.bin
//   ./bazelw run //models/mingpt:train -- --data=/tmp/train.bin --val_fraction=0.1 ...
//
// --tokenizer   gpt2 (the repository's copy of GPT-2's, the default) or a
//               folder with vocab.json + merges.txt (a Hugging Face model
//               folder) or encoder.json + vocab.bpe (OpenAI's); or T5's
//               SentencePiece: a spiece.model (any *.model file), a folder
//               holding one and no vocab.json (a Hugging Face T5 folder), or
//               sentencepiece:<file> (t5::SpieceTokenizer: the ids
//               tools/spm_tokenize.py writes, for //models/t5:train)
// --input       text files, comma-separated, encoded in that order
// --output      the token file (uint16 ids; written whole or not at all),
//               and beside it output.json recording the tokenizer, its
//               vocabulary size and the token count (data::TokenFileMeta,
//               nanoGPT's meta.pkl): train and sample then know the tokenizer
// --format      raw (nanoGPT's flat uint16, the default) or llmc (llm.c's
//               1024-byte header, then the uint16 ids)
// --append_eot  <|endoftext|> after each input, as nanoGPT's openwebtext
//               preparation does after each document (SentencePiece: </s>)
// --special_tokens  "<|endoftext|>" in the text is the special token (e.g.
//               TinyStories' story separators; tiktoken's allowed_special=
//               "all"); otherwise it is ordinary text
//
// Files are memory-mapped and encoded in parts of about --chunk_bytes, cut
// where GPT-2's pre-tokenizer always cuts (see Gpt2ChunkEnd), so memory stays
// bounded and the ids are those of each file encoded whole; --threads parts
// are encoded at once and written in order. SentencePiece's ids depend on
// where its input is cut (its Viterbi breaks near-ties by scores summed from
// the input's start), so its parts are cut where tools/spm_tokenize.py cuts
// them, whatever --chunk_bytes says: 2^20 characters, then on to the line's
// end. One line on stdout says what was written.
// Exit 2 on bad flags or input (named; SentencePiece: text that is not
// UTF-8, naming the file and byte).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "models/common/command_line.h"
#include "models/data/gpt2_tokenizer.h"
#include "models/data/mapped_file.h"
#include "models/data/runfiles.h"
#include "models/data/token_file.h"
#include "models/data/utf8.h"
#include "models/t5/spiece_files.h"
#include "models/t5/spiece_tokenizer.h"

ABSL_FLAG(std::string, tokenizer, "gpt2",
          "gpt2 (the repository's copy), a folder with vocab.json + merges.txt, or "
          "SentencePiece (T5's): a *.model file, a folder with spiece.model, or "
          "sentencepiece:<file>");
ABSL_FLAG(std::string, input, "", "text files to encode, comma-separated");
ABSL_FLAG(std::string, output, "", "the token file to write");
ABSL_FLAG(std::string, format, "raw", "raw (nanoGPT) or llmc (llm.c header)");
ABSL_FLAG(bool, append_eot, false,
          "append <|endoftext|> after each input (SentencePiece: the model's </s>)");
ABSL_FLAG(bool, special_tokens, false,
          "\"<|endoftext|>\" in the text is the special token, not ordinary text");
ABSL_FLAG(int64_t, chunk_bytes, int64_t{4} << 20,
          "GPT-2: text encoded per part (about); SentencePiece cuts where "
          "tools/spm_tokenize.py does (2^20 characters, on to a line end), whatever this says");
ABSL_FLAG(int, threads, 0, "parts encoded at once; 0: one per core");

namespace {

// The tokenizer --tokenizer names, as the encoding loop uses it.
struct TextEncoder {
  std::string record;  // data::TokenFileMeta's tokenizer: gpt2, a folder, sentencepiece:<file>
  int64_t vocab_size = 0;
  std::optional<int64_t> end_of_text;  // --append_eot's id
  std::vector<std::pair<std::string, std::string>> read;  // (what it is, path) of its files
  // Where the first part of `text` ends (at most the text's size). GPT-2:
  // past `bytes`, where a cut leaves the ids unchanged; SentencePiece: where
  // tools/spm_tokenize.py cuts, which gives its ids.
  std::function<size_t(absl::string_view text, size_t bytes)> part_end;
  // The ids of a part that starts at byte `offset` of its file (several at
  // once, from threads); InvalidArgument for text it cannot encode, naming
  // the file's byte.
  std::function<absl::StatusOr<std::vector<int64_t>>(absl::string_view part, size_t offset)>
      encode;
};

// Whether --tokenizer names a SentencePiece model: sentencepiece:<file>, a
// *.model that is not a folder, or a folder with spiece.model and no
// vocab.json (a folder with both is read as GPT-2's; sentencepiece:DIR says
// otherwise).
bool IsSentencePiece(const std::string& flag) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (absl::StartsWith(flag, "sentencepiece:")) return true;
  if (!fs::is_directory(flag, ec)) return absl::EndsWith(flag, ".model");
  return fs::exists(fs::path(flag) / "spiece.model", ec) &&
         !fs::exists(fs::path(flag) / "vocab.json", ec);
}

absl::StatusOr<TextEncoder> LoadTokenizer(const std::string& flag, bool special_tokens) {
  auto failed = [&](absl::string_view message) {
    return absl::InvalidArgumentError(absl::StrCat("--tokenizer=", flag, ": ", message));
  };
  TextEncoder encoder;
  if (IsSentencePiece(flag)) {
    if (special_tokens) {
      return absl::InvalidArgumentError(
          "--special_tokens: <|endoftext|> is GPT-2's; a SentencePiece model reads text as it is");
    }
    if (flag == "sentencepiece:") return failed("names no file (sentencepiece:<spiece.model>)");
    absl::StatusOr<t5::SentencePieceModel> model = t5::ReadSentencePieceModel(flag);
    if (!model.ok()) return failed(model.status().message());
    absl::StatusOr<t5::SpieceTokenizer> tokenizer = t5::SpieceTokenizer::Load(*model, 0);
    if (!tokenizer.ok()) return failed(tokenizer.status().message());
    auto shared = std::make_shared<const t5::SpieceTokenizer>(*std::move(tokenizer));
    std::error_code ec;
    const std::filesystem::path absolute = std::filesystem::absolute(model->path, ec);
    encoder.record = "sentencepiece:" + (ec ? model->path : absolute.lexically_normal().string());
    encoder.vocab_size = shared->pieces();
    if (shared->eos_id() >= 0) encoder.end_of_text = shared->eos_id();
    encoder.read.emplace_back("the tokenizer's model", model->path);
    encoder.part_end = [](absl::string_view text, size_t) {
      return t5::SentencePiecePartEnd(text);  // whatever --chunk_bytes says
    };
    encoder.encode = [shared](absl::string_view part,
                              size_t offset) -> absl::StatusOr<std::vector<int64_t>> {
      absl::StatusOr<std::vector<int64_t>> ids = shared->Encode(part, /*read_sentinels=*/false);
      if (ids.ok()) return ids;
      // Encode checks the text is UTF-8 (the only error without sentinels);
      // the message names the file's byte, not the part's.
      return absl::InvalidArgumentError(absl::StrCat(
          "byte ", offset + data::FirstNonUtf8(part) + 1,
          " does not begin a UTF-8 character (SentencePiece reads UTF-8 text)"));
    };
    return encoder;
  }
  absl::StatusOr<data::Gpt2Tokenizer> opened = data::Gpt2Tokenizer::Open(flag);
  if (!opened.ok()) return failed(opened.status().message());
  auto shared = std::make_shared<const data::Gpt2Tokenizer>(*std::move(opened));
  encoder.record = data::Gpt2Tokenizer::RecordName(flag);
  encoder.vocab_size = shared->vocab_size();
  encoder.end_of_text = shared->end_of_text();
  // The folder it was read from (the shipped one for gpt2).
  if (absl::StatusOr<std::pair<std::string, std::string>> files =
          data::Gpt2Tokenizer::FindFiles(shared->source());
      files.ok()) {
    encoder.read.emplace_back("the tokenizer's vocabulary", files->first);
    encoder.read.emplace_back("the tokenizer's merges", files->second);
  }
  encoder.part_end = [](absl::string_view text, size_t bytes) {
    return data::Gpt2ChunkEnd(text, bytes);
  };
  encoder.encode = [shared, special_tokens](absl::string_view part, size_t) {
    return absl::StatusOr<std::vector<int64_t>>(
        special_tokens ? shared->EncodeWithSpecialTokens(part) : shared->Encode(part));
  };
  return encoder;
}

// The files this run writes (--output and its record, OUT.json) must be none
// of those it reads (the inputs, the tokenizer's files): writing one would
// destroy it.
absl::Status CheckWritesNoInput(const std::string& output, const std::vector<std::string>& inputs,
                                const TextEncoder& tokenizer) {
  std::vector<std::pair<std::string, std::string>> read = tokenizer.read;  // (what it is, path)
  for (const std::string& input : inputs) read.emplace_back("the input", input);
  const std::string record = data::TokenFileMetaPath(output);
  for (const std::string& written : {output, record}) {
    for (const auto& [what, path] : read) {
      std::error_code ec;
      if (!std::filesystem::equivalent(written, path, ec)) continue;
      const std::string also =
          written == output ? "" : absl::StrCat(" (and its record ", written, ")");
      return absl::InvalidArgumentError(absl::StrCat(
          "--output=", output, also, ": ", path, " is ", what,
          ", which writing it would destroy; give another --output"));
    }
  }
  return absl::OkStatus();
}

absl::Status Tokenize() {
  const std::string output = absl::GetFlag(FLAGS_output);
  absl::StatusOr<std::vector<std::string>> listed =
      train::SplitListFlag("input", absl::GetFlag(FLAGS_input));
  if (!listed.ok()) return listed.status();
  const std::vector<std::string>& inputs = *listed;
  if (inputs.empty()) return absl::InvalidArgumentError("--input is required: text files");
  if (output.empty()) return absl::InvalidArgumentError("--output is required: a token file");
  if (std::error_code ec; std::filesystem::is_directory(output, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--output=", output, " is a folder; give the token file's path"));
  }
  const std::string format_flag = absl::GetFlag(FLAGS_format);
  if (format_flag != "raw" && format_flag != "llmc") {
    return absl::InvalidArgumentError(
        absl::StrCat("--format=", format_flag, ": expected raw or llmc"));
  }
  const int64_t chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  if (chunk_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--chunk_bytes must be >= 1, got ", chunk_bytes));
  }
  int threads = absl::GetFlag(FLAGS_threads);
  if (threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--threads must be >= 0, got ", threads));
  }
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  const std::string tokenizer_flag = absl::GetFlag(FLAGS_tokenizer);
  const bool append_eot = absl::GetFlag(FLAGS_append_eot);
  const bool special_tokens = absl::GetFlag(FLAGS_special_tokens);
  absl::StatusOr<TextEncoder> tokenizer = LoadTokenizer(tokenizer_flag, special_tokens);
  if (!tokenizer.ok()) return tokenizer.status();
  if (tokenizer->vocab_size > 65536) {
    return absl::InvalidArgumentError(absl::StrCat("--tokenizer=", tokenizer_flag, ": its ",
                                                   tokenizer->vocab_size,
                                                   " ids do not fit the uint16 token files"));
  }
  if (append_eot && !tokenizer->end_of_text.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("--append_eot: the tokenizer ", tokenizer_flag,
                                                   " has no end-of-text token"));
  }
  // Every input opens before anything is written.
  std::vector<std::shared_ptr<const data::MappedFile>> files;
  int64_t total_bytes = 0;
  for (const std::string& input : inputs) {
    absl::StatusOr<std::shared_ptr<const data::MappedFile>> file = data::MappedFile::Open(input);
    if (!file.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--input: ", file.status().message()));
    }
    total_bytes += (*file)->size();
    files.push_back(*std::move(file));
  }
  if (absl::Status s = CheckWritesNoInput(output, inputs, *tokenizer); !s.ok()) return s;
  if (total_bytes == 0 && !append_eot) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--input: ", absl::GetFlag(FLAGS_input), " holds no text (0 bytes): nothing to write"));
  }

  const auto start = std::chrono::steady_clock::now();
  const data::TokenFileFormat format =
      format_flag == "raw" ? data::TokenFileFormat::kRaw : data::TokenFileFormat::kLlmc;
  absl::StatusOr<std::unique_ptr<data::TokenFileWriter>> writer =
      data::TokenFileWriter::Create(output, format);
  if (!writer.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--output: ", writer.status().message()));
  }
  for (size_t f = 0; f < files.size(); ++f) {
    std::vector<absl::string_view> parts;
    for (absl::string_view rest = files[f]->bytes(); !rest.empty();) {
      const size_t end = tokenizer->part_end(rest, static_cast<size_t>(chunk_bytes));
      parts.push_back(rest.substr(0, end));
      rest.remove_prefix(end);
    }
    // `threads` parts at a time, appended in order.
    for (size_t first = 0; first < parts.size(); first += threads) {
      std::vector<std::future<absl::StatusOr<std::vector<int64_t>>>> encoded;
      for (size_t k = first; k < std::min(parts.size(), first + threads); ++k) {
        const size_t offset = parts[k].data() - files[f]->bytes().data();
        encoded.push_back(std::async(std::launch::async, [&, part = parts[k], offset] {
          return tokenizer->encode(part, offset);
        }));
      }
      for (size_t k = 0; k < encoded.size(); ++k) {
        absl::StatusOr<std::vector<int64_t>> ids = encoded[k].get();
        if (!ids.ok()) {  // the writer, destroyed unfinished, removes what it wrote
          return absl::InvalidArgumentError(
              absl::StrCat("--input: ", inputs[f], ": ", ids.status().message()));
        }
        absl::Status appended = (*writer)->Append(*ids);
        if (!appended.ok()) return appended;
      }
    }
    if (append_eot) {
      absl::Status appended = (*writer)->Append({*tokenizer->end_of_text});
      if (!appended.ok()) return appended;
    }
  }
  const int64_t num_tokens = (*writer)->num_tokens();
  if (num_tokens == 0) {  // e.g. only whitespace for SentencePiece; the .tmp goes with the writer
    return absl::InvalidArgumentError(absl::StrCat(
        "--input: ", absl::GetFlag(FLAGS_input), " gives no tokens: nothing to write"));
  }
  absl::Status finished = (*writer)->Finish();
  if (!finished.ok()) return finished;
  // What made it, for train and sample (output.json).
  absl::Status meta =
      data::WriteTokenFileMeta(output, {tokenizer->record, tokenizer->vocab_size, num_tokens});
  if (!meta.ok()) {
    std::filesystem::remove(output);  // not without its record
    return meta;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "wrote %lld tokens (tokenizer %s, vocab %lld) from %zu file(s), %lld bytes, to %s (%s) in "
      "%.2f s (%.1f MB/s, %d threads)\n",
      static_cast<long long>(num_tokens), tokenizer_flag.c_str(),
      static_cast<long long>(tokenizer->vocab_size), files.size(),
      static_cast<long long>(total_bytes), output.c_str(),
      format == data::TokenFileFormat::kRaw ? "raw uint16" : "llm.c", seconds,
      seconds > 0 ? total_bytes / seconds / 1e6 : 0.0, threads);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  train::ParseCommandLineOrExit(argc, argv,
      "Encodes text files as a token file: --input=a.txt[,b.txt] --output=train.bin "
      "[--tokenizer=gpt2|DIR|spiece.model --format=raw|llmc --append_eot]");
  data::SetProgramPath(argv[0]);
  absl::Status s = Tokenize();
  if (!s.ok()) {
    std::fprintf(stderr, "tokenize: error: %s\n", std::string(s.message()).c_str());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
