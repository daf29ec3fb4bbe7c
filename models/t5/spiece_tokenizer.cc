// T5's SentencePiece tokenizer with its sentinels (spiece_tokenizer.h).
#include "models/t5/spiece_tokenizer.h"

#include <cstdint>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "models/data/utf8.h"
#include "models/t5/spiece_processor.h"

namespace t5 {
namespace {

constexpr absl::string_view kSentinelOpen = "<extra_id_";

// The k of a "<extra_id_k>" at the start of `text` (digits without a
// leading zero, as Hugging Face writes them), and its length; -1 when the
// text does not start with one. k of more than 18 digits reads as int64
// max, which no vocabulary holds.
int64_t SentinelAt(absl::string_view text, size_t* length) {
  if (!absl::StartsWith(text, kSentinelOpen)) return -1;
  size_t end = kSentinelOpen.size();
  while (end < text.size() && absl::ascii_isdigit(static_cast<unsigned char>(text[end]))) ++end;
  const absl::string_view digits = text.substr(kSentinelOpen.size(), end - kSentinelOpen.size());
  if (digits.empty() || end >= text.size() || text[end] != '>') return -1;
  if (digits.size() > 1 && digits[0] == '0') return -1;
  *length = end + 1;
  int64_t k = 0;
  if (digits.size() > 18 || !absl::SimpleAtoi(digits, &k)) return INT64_MAX;
  return k;
}

}  // namespace

size_t SentencePiecePartEnd(absl::string_view text) {
  // The byte where character kSentencePiecePartChars starts (each byte but
  // UTF-8's continuation bytes 10xxxxxx begins one).
  size_t at = 0;
  for (size_t chars = 0; at < text.size(); ++at) {
    if ((static_cast<unsigned char>(text[at]) & 0xc0) == 0x80) continue;
    if (chars++ == kSentencePiecePartChars) break;
  }
  if (at >= text.size()) return text.size();
  const size_t line_end = text.find('\n', at);
  return line_end == absl::string_view::npos ? text.size() : line_end + 1;
}

SpieceTokenizer::SpieceTokenizer(std::unique_ptr<SpieceProcessor> sp, int64_t sentinels,
                                 std::string path)
    : sp_(std::move(sp)),
      pieces_(sp_->PieceSize()),
      sentinels_(sentinels),
      eos_id_(sp_->EosId()),
      path_(std::move(path)) {}

SpieceTokenizer::SpieceTokenizer(SpieceTokenizer&&) noexcept = default;
SpieceTokenizer& SpieceTokenizer::operator=(SpieceTokenizer&&) noexcept = default;
SpieceTokenizer::~SpieceTokenizer() = default;

absl::StatusOr<SpieceTokenizer> SpieceTokenizer::Load(const SentencePieceModel& model,
                                                      int64_t sentinels) {
  if (sentinels < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(model.path, ": ", sentinels, " sentinels (0 or more)"));
  }
  std::string error;
  std::unique_ptr<SpieceProcessor> sp = SpieceProcessor::Load(model.bytes, &error);
  if (sp == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(model.path, ": SentencePiece does not load it: ", error));
  }
  // Callers check the ids against the pieces ParseSentencePieces counted.
  if (sp->PieceSize() != static_cast<int64_t>(model.pieces.texts.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        model.path, ": SentencePiece loads ", sp->PieceSize(), " pieces of it, not the ",
        model.pieces.texts.size(), " its protobuf holds"));
  }
  return SpieceTokenizer(std::move(sp), sentinels, model.path);
}

absl::StatusOr<std::vector<int64_t>> SpieceTokenizer::Encode(absl::string_view text,
                                                             bool read_sentinels) const {
  if (const size_t bad = data::FirstNonUtf8(text); bad != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("it is not UTF-8 text (byte ", bad + 1, " does not begin a character)"));
  }
  std::vector<int64_t> ids;
  auto encode_run = [&](absl::string_view run) {
    for (int id : sp_->Encode(std::string(run))) ids.push_back(id);
  };
  size_t run_start = 0;
  for (size_t at = read_sentinels ? text.find('<') : absl::string_view::npos;
       at != absl::string_view::npos; at = text.find('<', at + 1)) {
    size_t length = 0;
    const int64_t k = SentinelAt(text.substr(at), &length);
    if (k < 0) continue;
    if (k >= sentinels_) {
      return absl::InvalidArgumentError(
          sentinels_ == 0
              ? absl::StrCat("'", text.substr(at, length), "' is a sentinel, and there are none")
              : absl::StrCat("'", text.substr(at, length), "' is not one of the ", sentinels_,
                             " sentinels (<extra_id_0> .. <extra_id_", sentinels_ - 1, ">)"));
    }
    encode_run(text.substr(run_start, at - run_start));
    ids.push_back(pieces_ + sentinels_ - 1 - k);
    run_start = at + length;
    at = run_start - 1;
  }
  encode_run(text.substr(run_start));
  return ids;
}

std::string SpieceTokenizer::Decode(absl::Span<const int64_t> ids) const {
  std::string out;
  std::vector<int> run;  // the model's ids since the last sentinel
  auto flush = [&] {
    if (run.empty()) return;
    std::string text = sp_->Decode(run);
    // SentencePiece drops the space a first piece starts with; after a
    // sentinel it is the text's own.
    int first = -1;
    for (int id : run) {
      if (!sp_->IsControl(id)) {
        first = id;
        break;
      }
    }
    if (!out.empty() && !text.empty() && first >= 0 &&
        absl::StartsWith(sp_->IdToPiece(first), "\xe2\x96\x81")) {  // U+2581
      out += ' ';
    }
    out += text;
    run.clear();
  };
  for (int64_t id : ids) {
    if (id >= 0 && id < pieces_) {
      run.push_back(static_cast<int>(id));
      continue;
    }
    flush();
    if (id >= pieces_ && id < pieces_ + sentinels_) {
      absl::StrAppend(&out, "<extra_id_", pieces_ + sentinels_ - 1 - id, ">");
    } else {
      absl::StrAppend(&out, "<|id ", id, "|>");
    }
  }
  flush();
  return out;
}

}  // namespace t5
