// Reading a Hugging Face model folder (hf_folder.h): config.json and the
// safetensors weights, one file or shards.
#include "models/common/hf_folder.h"

#include <algorithm>
#include <filesystem>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/common/train_support.h"
#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/read_file.h"

namespace train {
namespace {

using tensor::Json;

absl::StatusOr<std::string> ReadText(const std::string& path) {
  absl::StatusOr<std::string> text = tensor::ReadFile(path);
  if (!text.ok()) return absl::InvalidArgumentError(text.status().message());
  return text;
}

absl::StatusOr<Json> ReadJsonFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadText(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<Json> json = tensor::ParseJson(*text);
  if (!json.ok())
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", json.status().message()));
  if (json->kind != Json::Kind::kObject) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  return json;
}

// The safetensors files: model.safetensors, or the shards an index names.
absl::StatusOr<std::vector<std::string>> HfWeightFiles(const std::string& dir) {
  std::error_code ec;
  if (std::filesystem::exists(dir + "/model.safetensors", ec))
    return std::vector<std::string>{dir + "/model.safetensors"};
  const std::string index = dir + "/model.safetensors.index.json";
  if (!std::filesystem::exists(index, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir,
        " has no model.safetensors (nor model.safetensors.index.json); only safetensors "
        "weights are read, not pytorch_model.bin"));
  }
  absl::StatusOr<Json> json = ReadJsonFile(index);
  if (!json.ok()) return json.status();
  const Json* map = json->Get("weight_map");
  if (map == nullptr || map->kind != Json::Kind::kObject) {
    return absl::InvalidArgumentError(absl::StrCat(index, ": no weight_map object"));
  }
  std::vector<std::string> files;
  std::set<std::string> seen;
  for (const auto& [name, file] : map->fields) {
    if (file.kind != Json::Kind::kString || absl::StrContains(file.text, "/")) {
      return absl::InvalidArgumentError(
          absl::StrCat(index, ": weight_map['", name, "'] is not a file name in the folder"));
    }
    if (seen.insert(file.text).second) files.push_back(dir + "/" + file.text);
  }
  return files;
}

}  // namespace

bool IsHfModelDir(const std::string& dir) {
  std::error_code ec;
  return std::filesystem::exists(dir + "/config.json", ec);
}

absl::StatusOr<Json> ReadHfConfig(const std::string& dir) {
  return ReadJsonFile(dir + "/config.json");
}

absl::StatusOr<int64_t> HfConfigInt(const Json& json, const std::string& path,
                                    const std::string& key, const int64_t* fallback) {
  const Json* v = json.Get(key);
  if (v == nullptr) {
    if (fallback != nullptr) return *fallback;
    return absl::InvalidArgumentError(absl::StrCat(path, ": no '", key, "'"));
  }
  int64_t out = 0;
  if (v->kind != Json::Kind::kNumber || !absl::SimpleAtoi(v->text, &out)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": '", key, "' is not an integer (", v->text, ")"));
  }
  return out;
}

absl::StatusOr<std::map<std::string, HfTensor>> OpenHfTensors(const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> files = HfWeightFiles(dir);
  if (!files.ok()) return files.status();
  std::map<std::string, HfTensor> tensors;
  for (const std::string& file : *files) {
    // Checked against its checksum when it has one.
    absl::StatusOr<tensor::SafetensorsHeader> header = tensor::ReadVerifiedSafetensorsHeader(file);
    if (!header.ok()) return header.status();
    auto shared = std::make_shared<const tensor::SafetensorsHeader>(*std::move(header));
    for (const tensor::SafetensorsEntry& e : shared->entries) {
      if (!tensors.emplace(e.name, HfTensor{file, shared, &e}).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(dir, ": tensor '", e.name, "' is in the files twice"));
      }
    }
  }
  return tensors;
}

absl::StatusOr<std::shared_ptr<const nn::InitSource>> HfTensorSource(const std::string& dir,
                                                                     const std::string& name,
                                                                     const HfTensor& t,
                                                                     const tensor::Shape& want) {
  if (t.entry->shape != want) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": tensor '", name, "' has shape ",
                                                   t.entry->shape.ToString(),
                                                   "; config.json's sizes need ", want.ToString()));
  }
  if (!tensor::IsFloatingPoint(t.entry->dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": tensor '", name, "' is ", tensor::DtypeName(t.entry->dtype)));
  }
  return nn::SafetensorsEntrySource(t.file, t.header, *t.entry);
}

absl::Status CheckNoOtherHfTensors(const std::string& dir,
                                   const std::map<std::string, HfTensor>& tensors,
                                   const std::set<std::string>& used, absl::string_view model) {
  std::vector<std::string> others;
  for (const auto& [name, t] : tensors) {
    if (used.count(name) == 0) others.push_back(name);
  }
  if (others.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      dir, ": tensors ", model, " of config.json's sizes does not have: ",
      absl::StrJoin(others.begin(), others.begin() + std::min<size_t>(others.size(), 5), ", "),
      others.size() > 5 ? ", ..." : ""));
}

absl::Status WriteHfWeights(
    const std::string& dir, const nn::NamedInitSources& weights,
    const std::vector<HfWeightOut>& layout, const std::string& model,
    const std::function<void(const std::string&, const tensor::Tensor&)>& seen) {
  std::map<std::string, const nn::InitSource*> by_name;
  for (const auto& [name, source] : weights) by_name[name] = source.get();
  std::vector<tensor::SafetensorsWriter::Decl> entries;
  std::vector<const nn::InitSource*> sources;
  for (const HfWeightOut& w : layout) {
    auto it = by_name.find(w.name);
    if (it == by_name.end()) {
      return absl::InvalidArgumentError(absl::StrCat("no weight '", w.name, "' for ", model));
    }
    const tensor::Shape& shape = it->second->shape();
    if (shape != w.shape) {
      return absl::InvalidArgumentError(absl::StrCat("weight '", w.name, "' has shape ",
                                                     shape.ToString(), "; ", model, " needs ",
                                                     w.shape.ToString()));
    }
    entries.push_back(
        {w.name, tensor::Dtype::kF32, w.transposed ? tensor::Shape({shape[1], shape[0]}) : shape});
    sources.push_back(it->second);
    by_name.erase(it);
  }
  if (!by_name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight '", by_name.begin()->first, "' is not a parameter of ", model));
  }
  absl::Status s = MakeCheckpointDir(dir);
  if (!s.ok()) return s;
  absl::StatusOr<std::unique_ptr<tensor::SafetensorsWriter>> file =
      tensor::SafetensorsWriter::Create(dir + "/model.safetensors", entries, {{"format", "pt"}});
  if (!file.ok()) return file.status();
  for (size_t i = 0; i < sources.size(); ++i) {
    tensor::Tensor t = tensor::Tensor::Empty(sources[i]->shape());  // f32, host
    try {
      sources[i]->Read(0, t);
    } catch (const tensor::OpError& e) {
      return absl::DataLossError(absl::StrCat("reading '", entries[i].name, "': ", e.what()));
    }
    if (seen) seen(layout[i].name, t);
    s = (*file)->Append(layout[i].transposed ? t.Transpose(0, 1) : t);
    if (!s.ok()) return s;
  }
  return (*file)->Finish();
}

}  // namespace train
