// The module buffers of a sharded checkpoint (see
// sharded_checkpoint_buffers.h).
#include "dist/sharded_checkpoint_buffers.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dist/sharded_checkpoint_folder.h"

namespace dist::sharded {
namespace {

using tensor::Tensor;

uint32_t BytesCrc(const Tensor& host_contiguous) {
  return tensor::Crc32c(host_contiguous.raw_data(), host_contiguous.nbytes());
}

std::string Describe(tensor::Dtype dtype, const tensor::Shape& shape) {
  return absl::StrCat(tensor::DtypeName(dtype), " ", shape.ToString());
}

// "a, b, c" of the first five, and how many in all beyond.
std::string FirstFew(const std::vector<std::string>& v) {
  std::vector<std::string> head(v.begin(), v.begin() + std::min<size_t>(v.size(), 5));
  return absl::StrCat(absl::StrJoin(head, ", "),
                      v.size() > 5 ? absl::StrCat(", ... (", v.size(), " in all)") : "");
}

}  // namespace

absl::StatusOr<BuffersFileRec> WriteBuffers(const std::string& dir, const std::string& id,
                                            const tensor::NamedTensors& buffers) {
  BuffersFileRec rec;
  if (buffers.empty()) return rec;
  tensor::NamedTensors host;
  for (const auto& [name, t] : buffers) {
    if (!t.defined()) {
      return absl::InvalidArgumentError(absl::StrCat("buffer '", name, "' has no value"));
    }
    Tensor h = t.To(tensor::Device::Cpu()).Contiguous();
    rec.tensors.push_back({name, h.shape(), h.dtype(), BytesCrc(h)});
    host.emplace_back(name, std::move(h));
  }
  const std::string path = absl::StrCat(dir, "/", kBuffersFile);
  absl::Status s = tensor::WriteSafetensors(path, host, {{kIdKey, id}});
  if (!s.ok()) return s;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus("cannot stat", path);
  rec.bytes = static_cast<int64_t>(st.st_size);
  return rec;
}

absl::StatusOr<tensor::NamedTensors> ReadBuffers(const std::string& dir, const Index& x) {
  tensor::NamedTensors out;
  if (x.model_buffers.tensors.empty()) return out;
  const std::string path = absl::StrCat(dir, "/", kBuffersFile);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat("buffers file '", path, "' is missing (index.json lists it)"));
    }
    return ErrnoStatus("cannot stat", path);
  }
  if (st.st_size != x.model_buffers.bytes) {
    return absl::DataLossError(absl::StrCat(
        "'", path, "' has ", static_cast<int64_t>(st.st_size), " bytes but index.json records ",
        x.model_buffers.bytes,
        st.st_size < x.model_buffers.bytes ? " (truncated)" : " (replaced or appended to)"));
  }
  absl::StatusOr<tensor::SafetensorsHeader> h = tensor::ReadSafetensorsHeader(path);
  if (!h.ok()) return h.status();
  auto id = h->metadata.find(kIdKey);
  if (id == h->metadata.end() || id->second != x.id) {
    return absl::DataLossError(
        absl::StrCat("'", path, "' belongs to another checkpoint (id ",
                     id == h->metadata.end() ? std::string("none") : id->second,
                     ", index.json has ", x.id, ")"));
  }
  for (const BufferRec& b : x.model_buffers.tensors) {
    const tensor::SafetensorsEntry* e = h->Find(b.name);
    if (e == nullptr) {
      return absl::DataLossError(
          absl::StrCat("'", path, "' lacks buffer '", b.name, "' that index.json lists"));
    }
    if (e->dtype != b.dtype || e->shape != b.shape) {
      return absl::DataLossError(absl::StrCat("'", path, "': buffer '", b.name, "' is ",
                                              Describe(e->dtype, e->shape), ", index.json records ",
                                              Describe(b.dtype, b.shape)));
    }
    absl::StatusOr<Tensor> t = tensor::ReadSafetensorsEntry(path, *h, *e);
    if (!t.ok()) return t.status();
    const uint32_t crc = BytesCrc(*t);
    if (crc != b.crc) {
      return absl::DataLossError(absl::StrCat("'", path, "' is corrupted: buffer '", b.name,
                                              "' has checksum ", Hex32(crc),
                                              " but index.json records ", Hex32(b.crc)));
    }
    out.emplace_back(b.name, std::move(*t));
  }
  return out;
}

absl::StatusOr<std::vector<Tensor>> StageBuffers(const std::string& dir, const Index& x,
                                                 const ModuleBuffers& model) {
  std::map<std::string, const BufferRec*> saved;
  for (const BufferRec& b : x.model_buffers.tensors) saved[b.name] = &b;
  std::vector<std::string> missing, mismatched;
  std::set<std::string> model_names;
  for (const auto& [name, t] : model) {
    model_names.insert(name);
    auto it = saved.find(name);
    if (it == saved.end()) {
      missing.push_back(name);
    } else if (!t->defined() || t->dtype() != it->second->dtype ||
               t->shape() != it->second->shape) {
      mismatched.push_back(absl::StrCat(
          "'", name, "' is ", Describe(it->second->dtype, it->second->shape),
          " in the checkpoint but ",
          t->defined() ? Describe(t->dtype(), t->shape()) : std::string("undefined"),
          " in the model"));
    }
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "buffers of the model missing from the checkpoint: ", FirstFew(missing),
        x.model_buffers.tensors.empty()
            ? " (the checkpoint holds no buffers: saved from a model without them, or by a "
              "build before sharded checkpoints saved buffers; "
              "ShardedLoadOptions::keep_buffers_missing_from_checkpoint keeps the model's)"
            : ""));
  }
  std::vector<std::string> unexpected;
  for (const BufferRec& b : x.model_buffers.tensors) {
    if (model_names.count(b.name) == 0) unexpected.push_back(b.name);
  }
  if (!unexpected.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("buffers in the checkpoint that the model lacks: ", FirstFew(unexpected)));
  }
  if (!mismatched.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("buffer shape or dtype mismatch: ", FirstFew(mismatched)));
  }
  absl::StatusOr<tensor::NamedTensors> read = ReadBuffers(dir, x);
  if (!read.ok()) return read.status();
  std::map<std::string, Tensor> by_name(read->begin(), read->end());
  std::vector<Tensor> staged;
  for (const auto& [name, t] : model) staged.push_back(by_name.at(name));
  return staged;
}

void CommitBuffers(const std::vector<Tensor>& staged, const ModuleBuffers& model) {
  for (size_t i = 0; i < model.size(); ++i) {
    Tensor& dst = *model[i].second;
    // Host to a contiguous device buffer of its dtype straight in (nothing
    // allocated here); through a device copy otherwise.
    const bool direct = dst.device().is_cpu() ||
                        (dst.is_contiguous() && dst.dtype() == staged[i].dtype());
    dst.CopyFrom(direct ? staged[i] : staged[i].To(dst.device()));
  }
}

}  // namespace dist::sharded
