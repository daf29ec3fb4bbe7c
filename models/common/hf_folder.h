// A Hugging Face model folder, as transformers' save_pretrained writes it:
// config.json and the weights in model.safetensors, or in the shards that
// model.safetensors.index.json names. What minGPT's GPT-2 reader and T5's
// reader (models/mingpt/pretrained.h, models/t5/pretrained.h) share: the
// config as JSON, every tensor's header entry (no weight is read here), and a
// checked source per weight, read slice by slice as f32 (so an FSDP rank
// reads only its shard).
#ifndef MODELS_COMMON_HF_FOLDER_H_
#define MODELS_COMMON_HF_FOLDER_H_

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nn/state_dict.h"
#include "tensor/json.h"
#include "tensor/safetensors.h"
#include "tensor/shape.h"

namespace train {

// True when `dir` holds a Hugging Face model (config.json).
bool IsHfModelDir(const std::string& dir);

// dir/config.json parsed. InvalidArgument naming the file when it cannot be
// read, is not JSON, or is not an object.
absl::StatusOr<tensor::Json> ReadHfConfig(const std::string& dir);

// An integer field of config.json: InvalidArgument naming `path` and the key
// when it is missing (and `fallback` is null) or not an integer.
absl::StatusOr<int64_t> HfConfigInt(const tensor::Json& json, const std::string& path,
                                    const std::string& key, const int64_t* fallback = nullptr);

// One tensor of the weights: its file and header entry.
struct HfTensor {
  std::string file;
  std::shared_ptr<const tensor::SafetensorsHeader> header;
  const tensor::SafetensorsEntry* entry = nullptr;
};

// Every tensor of the folder's weights under its name in the files. The
// headers are checked against the project's checksum where a file carries
// one. InvalidArgument when the folder has neither model.safetensors nor an
// index (pytorch_model.bin is not read), for a bad index, or a name in two
// files.
absl::StatusOr<std::map<std::string, HfTensor>> OpenHfTensors(const std::string& dir);

// The source of tensor `name` (read as f32), after checking that it is
// floating point and shaped `want` (else InvalidArgument naming `dir`, the
// tensor, its shape and `want`, which config.json's sizes call for).
absl::StatusOr<std::shared_ptr<const nn::InitSource>> HfTensorSource(const std::string& dir,
                                                                     const std::string& name,
                                                                     const HfTensor& tensor,
                                                                     const tensor::Shape& want);

// OK when every tensor's name is in `used`; else InvalidArgument naming `dir`
// and (up to 5 of) the others: tensors a `model` of config.json's sizes does
// not have.
absl::Status CheckNoOtherHfTensors(const std::string& dir,
                                   const std::map<std::string, HfTensor>& tensors,
                                   const std::set<std::string>& used, absl::string_view model);

// One weight of a folder to write: our name and shape, and whether the file
// stores it transposed (GPT-2's Conv1D weights).
struct HfWeightOut {
  std::string name;
  tensor::Shape shape;
  bool transposed = false;
};

// Writes dir/model.safetensors (dir created if missing) from `weights` (ours,
// by name), in the order and shapes of `layout`, f32, one weight read and
// written at a time; `seen(name, value)`, when given, sees each weight as it
// is written (in our layout). InvalidArgument naming `model` for a weight
// missing, misshapen or not in the layout; DataLoss naming the weight when a
// read fails.
absl::Status WriteHfWeights(
    const std::string& dir, const nn::NamedInitSources& weights,
    const std::vector<HfWeightOut>& layout, const std::string& model,
    const std::function<void(const std::string&, const tensor::Tensor&)>& seen = nullptr);

}  // namespace train

#endif  // MODELS_COMMON_HF_FOLDER_H_
