// Module state dicts.
#include "nn/state_dict.h"

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tensor/error.h"

namespace nn {

tensor::NamedTensors StateDict(Module& module, const std::string& prefix) {
  tensor::NamedTensors out;
  for (auto& [name, p] : module.NamedParameters()) {
    OP_CHECK(p->held_by.empty(), "StateDict", "parameter '", prefix, name, "' is held by ",
             p->held_by, ": its value is the wrapper's (a shard, or a low-precision copy of "
             "the fp32 master); take the state from the wrapper (FSDP's FullStateDict, "
             "dist::SaveSharded)");
    out.emplace_back(prefix + name, p->value.To(tensor::Device::Cpu()).To(tensor::Dtype::kF32));
  }
  for (auto& [name, b] : module.NamedBuffers()) {
    if (b->defined()) out.emplace_back(prefix + name, b->To(tensor::Device::Cpu()));
  }
  return out;
}

namespace {

struct Target {
  std::string name;
  Tensor* dst;       // the parameter value or buffer to fill
  Parameter* param;  // the parameter; nullptr for a buffer
  tensor::Shape shape;
  size_t entry = 0;  // index of its entry in what was given
};

// Pairs every parameter and (defined) buffer of `module` with its entry
// among `names` (entries[i] named names[i], of shape shapes[i] and, when
// `dtypes` is given, dtype (*dtypes)[i]), checking names, shapes and dtypes
// as CheckStateDict documents.
absl::StatusOr<std::vector<Target>> MatchStateDict(Module& module,
                                                   const std::vector<std::string>& names,
                                                   const std::vector<tensor::Shape>& shapes,
                                                   const std::vector<tensor::Dtype>* dtypes,
                                                   const std::string& prefix) {
  std::map<std::string, size_t> given;
  for (size_t i = 0; i < names.size(); ++i) {
    if (!given.emplace(names[i], i).second) {
      return absl::InvalidArgumentError(absl::StrCat("state dict names '", names[i], "' twice"));
    }
  }
  std::vector<Target> targets;
  for (auto& [name, p] : module.NamedParameters()) {
    targets.push_back({prefix + name, &p->value, p, p->shape});
  }
  for (auto& [name, b] : module.NamedBuffers()) {
    if (b->defined()) targets.push_back({prefix + name, b, nullptr, b->shape()});
  }
  std::vector<std::string> missing;
  for (Target& t : targets) {
    auto it = given.find(t.name);
    if (it == given.end()) {
      missing.push_back(t.name);
      continue;
    }
    t.entry = it->second;
    given.erase(it);
    if (shapes[t.entry] != t.shape) {
      return absl::InvalidArgumentError(absl::StrCat("state dict entry '", t.name, "' has shape ",
                                                     shapes[t.entry].ToString(),
                                                     ", the model expects ", t.shape.ToString()));
    }
    // Parameters are floating; so is a buffer's entry where the buffer is.
    const bool floating = t.param != nullptr || tensor::IsFloatingPoint(t.dst->dtype());
    if (dtypes != nullptr && floating && !tensor::IsFloatingPoint((*dtypes)[t.entry])) {
      return absl::InvalidArgumentError(absl::StrCat("state dict entry '", t.name, "' has dtype ",
                                                     tensor::DtypeName((*dtypes)[t.entry]),
                                                     ", expected a floating dtype"));
    }
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("state dict lacks ", missing.size(), " entries: ",
                     absl::StrJoin(missing.begin(),
                                   missing.begin() + std::min<size_t>(missing.size(), 5), ", "),
                     missing.size() > 5 ? ", ..." : ""));
  }
  if (!given.empty()) {
    std::vector<std::string> unknown;
    for (const auto& [name, i] : given) unknown.push_back(name);
    return absl::InvalidArgumentError(absl::StrCat("state dict has entries the model lacks: ",
                                                   absl::StrJoin(unknown, ", ")));
  }
  return targets;
}

// One entry of a safetensors file, read slice by slice.
class SafetensorsSliceSource : public InitSource {
 public:
  SafetensorsSliceSource(std::string path, std::shared_ptr<const tensor::SafetensorsHeader> header,
                         std::string name, tensor::Shape shape)
      : path_(std::move(path)),
        header_(std::move(header)),
        name_(std::move(name)),
        shape_(std::move(shape)) {}
  const tensor::Shape& shape() const override { return shape_; }
  void Read(int64_t begin, Tensor& out) const override {
    absl::Status s = tensor::ReadSafetensorsSlice(path_, *header_, name_, begin, out);
    OP_CHECK(s.ok(), "init_from_file", s.message());
  }

 private:
  std::string path_;
  std::shared_ptr<const tensor::SafetensorsHeader> header_;
  std::string name_;
  tensor::Shape shape_;
};

// The transpose of a 2-D source (TransposedInitSource).
class TransposedSource : public InitSource {
 public:
  // Whole rows of the transpose read at a time: at most this many elements
  // (or one row) of temporaries.
  static constexpr int64_t kBlockElements = int64_t{1} << 20;

  explicit TransposedSource(std::shared_ptr<const InitSource> source)
      : source_(std::move(source)), shape_({source_->shape().dim(1), source_->shape().dim(0)}) {}
  const tensor::Shape& shape() const override { return shape_; }
  void Read(int64_t begin, Tensor& out) const override {
    const int64_t n = out.numel();
    const int64_t rows = source_->shape().dim(0);  // the transpose's row length
    const int64_t cols = source_->shape().dim(1);  // the transpose's rows
    OP_CHECK(begin >= 0 && begin + n <= rows * cols, "init_from_transposed", "elements [", begin,
             ", ", begin + n, ") of ", rows * cols);
    Tensor flat = out.Reshape({n});  // out is contiguous: a view of it
    for (int64_t done = 0; done < n;) {
      const int64_t at = begin + done;
      const int64_t row = at / rows;  // of the transpose: column `row` of the source
      const int64_t offset = at % rows;
      if (offset != 0 || n - done < rows) {  // part of a row: elements [offset, offset + k)
        const int64_t k = std::min(rows - offset, n - done);
        Tensor part = Tensor::Empty(tensor::Shape({k}), out.dtype());  // (k)
        for (int64_t r = 0; r < k; ++r) {
          Tensor element = part.Narrow(0, r, 1);
          source_->Read((offset + r) * cols + row, element);
        }
        flat.Narrow(0, done, k).CopyFrom(part);
        done += k;
        continue;
      }
      // Whole rows [row, row + count): each source row's segment, then transposed.
      const int64_t count =
          std::min((n - done) / rows, std::max<int64_t>(1, kBlockElements / rows));
      Tensor block = Tensor::Empty(tensor::Shape({rows, count}), out.dtype());  // (rows, count)
      for (int64_t r = 0; r < rows; ++r) {
        Tensor segment = block.Narrow(0, r, 1);  // (1, count), contiguous
        source_->Read(r * cols + row, segment);
      }
      flat.Narrow(0, done, count * rows)
          .View(tensor::Shape({count, rows}))
          .CopyFrom(block.Transpose(0, 1));
      done += count * rows;
    }
  }

 private:
  std::shared_ptr<const InitSource> source_;
  tensor::Shape shape_;
};

}  // namespace

std::shared_ptr<const InitSource> SafetensorsEntrySource(
    std::string path, std::shared_ptr<const tensor::SafetensorsHeader> header,
    const tensor::SafetensorsEntry& entry) {
  return std::make_shared<SafetensorsSliceSource>(std::move(path), std::move(header), entry.name,
                                                  entry.shape);
}

std::shared_ptr<const InitSource> TransposedInitSource(std::shared_ptr<const InitSource> source) {
  OP_CHECK(source != nullptr && source->shape().rank() == 2, "TransposedInitSource",
           "needs a 2-D source, got ", source == nullptr ? "none" : source->shape().ToString());
  return std::make_shared<TransposedSource>(std::move(source));
}

absl::StatusOr<NamedInitSources> SafetensorsInitSources(const std::string& path) {
  absl::StatusOr<tensor::SafetensorsHeader> header = tensor::ReadVerifiedSafetensorsHeader(path);
  if (!header.ok()) return header.status();
  auto shared = std::make_shared<const tensor::SafetensorsHeader>(*std::move(header));
  NamedInitSources sources;
  for (const tensor::SafetensorsEntry& e : shared->entries) {
    if (!tensor::IsFloatingPoint(e.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("'", path, "': tensor '", e.name, "' is ",
                                                     tensor::DtypeName(e.dtype),
                                                     ", not a floating dtype"));
    }
    sources.emplace_back(e.name, SafetensorsEntrySource(path, shared, e));
  }
  return sources;
}

namespace {

// LoadStateDict over entries of any origin: `dtypes[i]` is entry i's dtype and
// `fill(i, dst)` writes entry i into `dst` (a defined tensor of its shape).
// Every check runs before the first fill.
absl::Status LoadEntries(Module& module, const std::vector<std::string>& names,
                         const std::vector<tensor::Shape>& shapes,
                         const std::vector<tensor::Dtype>& dtypes, const std::string& prefix,
                         const std::function<absl::Status(size_t, Tensor&)>& fill) {
  absl::StatusOr<std::vector<Target>> targets =
      MatchStateDict(module, names, shapes, &dtypes, prefix);
  if (!targets.ok()) return targets.status();
  for (const Target& t : *targets) {
    // A wrapper's parameter: a value written here would be replaced by the
    // wrapper's (the shard gathered again, the fp32 master cast again).
    if (t.param != nullptr && !t.param->held_by.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "parameter '", t.name, "' is held by ", t.param->held_by,
          ", which would replace what is loaded into it: load before wrapping (or "
          "nn::InitFromStateDict before FullyShard), or through the wrapper (FSDP's "
          "LoadFullStateDict, dist::LoadSharded)"));
    }
  }
  tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kParameters);
  for (Target& t : *targets) {
    if (!t.dst->defined()) {
      *t.dst = Tensor::Empty(t.shape, tensor::Dtype::kF32);
    }
    absl::Status s = fill(t.entry, *t.dst);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// The names, shapes and dtypes of a state dict's entries, in its order.
struct Entries {
  std::vector<std::string> names;
  std::vector<tensor::Shape> shapes;
  std::vector<tensor::Dtype> dtypes;
};
Entries EntriesOf(const tensor::NamedTensors& state) {
  Entries e;
  for (const auto& [name, t] : state) {
    e.names.push_back(name);
    e.shapes.push_back(t.shape());
    e.dtypes.push_back(t.dtype());
  }
  return e;
}

}  // namespace

absl::Status CheckStateDict(Module& module, const tensor::NamedTensors& state) {
  const Entries e = EntriesOf(state);
  return MatchStateDict(module, e.names, e.shapes, &e.dtypes, "").status();
}

absl::Status LoadStateDict(Module& module, const tensor::NamedTensors& state,
                           const std::string& prefix) {
  const Entries e = EntriesOf(state);
  return LoadEntries(module, e.names, e.shapes, e.dtypes, prefix, [&](size_t i, Tensor& dst) {
    Tensor src = state[i].second.To(dst.dtype());
    dst.CopyFrom(dst.device().is_cpu() ? src : src.To(dst.device()));
    return absl::OkStatus();
  });
}

absl::Status LoadStateDictFromSafetensors(Module& module, const std::string& path,
                                          const tensor::SafetensorsHeader& header,
                                          const std::string& prefix) {
  std::vector<std::string> names;
  std::vector<tensor::Shape> shapes;
  std::vector<tensor::Dtype> dtypes;
  for (const tensor::SafetensorsEntry& e : header.entries) {
    names.push_back(e.name);
    shapes.push_back(e.shape);
    dtypes.push_back(e.dtype);
  }
  return LoadEntries(module, names, shapes, dtypes, prefix, [&](size_t i, Tensor& dst) {
    // Straight into a contiguous host destination; through one host tensor otherwise.
    if (dst.device().is_cpu() && dst.is_contiguous()) {
      return tensor::ReadSafetensorsSlice(path, header, names[i], 0, dst);
    }
    Tensor host = Tensor::Empty(dst.shape(), dst.dtype());
    absl::Status s = tensor::ReadSafetensorsSlice(path, header, names[i], 0, host);
    if (s.ok()) dst.CopyFrom(host.To(dst.device()));
    return s;
  });
}

absl::Status InitFromSources(Module& module, const NamedInitSources& sources,
                             const std::string& prefix) {
  std::vector<std::string> names;
  std::vector<tensor::Shape> shapes;
  for (const auto& [name, source] : sources) {
    names.push_back(name);
    shapes.push_back(source->shape());
  }
  absl::StatusOr<std::vector<Target>> targets =
      MatchStateDict(module, names, shapes, /*dtypes=*/nullptr, prefix);
  if (!targets.ok()) return targets.status();
  for (const Target& t : *targets) {
    if (t.param != nullptr && t.param->value.defined()) {
      return absl::FailedPreconditionError(
          absl::StrCat("parameter '", t.name,
                       "' already has values: initialize from a state dict before "
                       "materializing or sharding"));
    }
  }
  for (Target& t : *targets) {
    const std::shared_ptr<const InitSource>& source = sources[t.entry].second;
    if (t.param != nullptr) {
      t.param->init = InitSpec::From(source);
    } else {  // buffers are small: read whole
      tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kParameters);
      Tensor host = Tensor::Empty(t.shape, t.dst->dtype());  // (a defined buffer)
      source->Read(0, host);
      t.dst->CopyFrom(host.To(t.dst->device()));
    }
  }
  return absl::OkStatus();
}

NamedInitSources TensorInitSources(tensor::NamedTensors tensors) {
  NamedInitSources sources;
  for (auto& [name, t] : tensors) {
    Tensor host = t.device().is_cpu() ? t.Contiguous() : t.To(tensor::Device::Cpu()).Contiguous();
    sources.emplace_back(std::move(name), std::make_shared<TensorInitSource>(std::move(host)));
  }
  return sources;
}

absl::Status InitFromStateDict(Module& module, const tensor::NamedTensors& state,
                               const std::string& prefix) {
  return InitFromSources(module, TensorInitSources(state), prefix);
}

void ReleaseInitValues(Module& module) {
  for (auto& [name, p] : module.NamedParameters()) {
    if (p->init.kind == InitSpec::Kind::kFrom) p->init.from = nullptr;
  }
}

}  // namespace nn
