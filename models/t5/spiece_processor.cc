// The one translation unit that includes libsentencepiece's header (see
// spiece_processor.h): no Abseil header may be included here.
#include "models/t5/spiece_processor.h"

#include <sentencepiece_processor.h>

#include <stdexcept>
#include <utility>

namespace t5 {

SpieceProcessor::SpieceProcessor(std::unique_ptr<sentencepiece::SentencePieceProcessor> sp)
    : sp_(std::move(sp)) {}

SpieceProcessor::~SpieceProcessor() = default;

std::unique_ptr<SpieceProcessor> SpieceProcessor::Load(const std::string& model_bytes,
                                                       std::string* error) {
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const sentencepiece::util::Status s = sp->LoadFromSerializedProto(model_bytes);
  if (!s.ok()) {
    *error = s.ToString();
    return nullptr;
  }
  return std::unique_ptr<SpieceProcessor>(new SpieceProcessor(std::move(sp)));
}

int SpieceProcessor::PieceSize() const { return sp_->GetPieceSize(); }
int SpieceProcessor::EosId() const { return sp_->eos_id(); }
bool SpieceProcessor::IsControl(int id) const { return sp_->IsControl(id); }
std::string SpieceProcessor::IdToPiece(int id) const { return sp_->IdToPiece(id); }

std::vector<int> SpieceProcessor::Encode(const std::string& text) const {
  std::vector<int> ids;
  const sentencepiece::util::Status s = sp_->Encode(text, &ids);
  // A loaded model encodes any text; a failure is the library's bug.
  if (!s.ok()) throw std::runtime_error("SentencePiece Encode: " + s.ToString());
  return ids;
}

std::string SpieceProcessor::Decode(const std::vector<int>& ids) const {
  std::string text;
  const sentencepiece::util::Status s = sp_->Decode(ids, &text);
  // Callers pass ids below PieceSize() only.
  if (!s.ok()) throw std::runtime_error("SentencePiece Decode: " + s.ToString());
  return text;
}

}  // namespace t5
