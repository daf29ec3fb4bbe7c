// Whole parameters of a sharded checkpoint on one process (see
// sharded_checkpoint_offline.h).
#include "dist/sharded_checkpoint_offline.h"

#include <sys/stat.h>

#include <filesystem>
#include <memory>
#include <mutex>
#include <set>
#include <system_error>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "dist/sharded_checkpoint_buffers.h"
#include "dist/sharded_checkpoint_folder.h"
#include "dist/sharded_checkpoint_index.h"
#include "dist/sharded_checkpoint_reader.h"
#include "tensor/durable_file.h"
#include "tensor/error.h"
#include "tensor/safetensors.h"

namespace dist {

absl::Status ForEachWholeParameter(const std::string& dir_in, bool with_optimizer_state,
                                   const std::function<absl::Status(const WholeParameter&)>& fn) {
  const std::string dir = sharded::StripTrailingSlashes(dir_in);
  absl::StatusOr<sharded::Index> x = sharded::ReadIndex(dir);
  if (!x.ok()) return x.status();
  sharded::SliceReader reader(dir, *x);
  for (const sharded::ParamRec& r : x->params) {
    WholeParameter p;
    p.name = r.name;
    p.value = tensor::Tensor::Empty(r.shape);  // f32 (ValidateIndex: numel == shape's)
    absl::Status s = reader.ReadRange(r.value, 0, r.numel, p.value.Reshape({r.numel}));
    if (!s.ok()) return s;
    if (with_optimizer_state && r.has_state) {
      p.has_state = true;
      p.step = r.step;
      for (const std::string& key : x->buffers) {
        tensor::Tensor b = tensor::Tensor::Empty(r.shape);
        s = reader.ReadRange(r.state.at(key), 0, r.numel, b.Reshape({r.numel}));
        if (!s.ok()) return s;
        p.buffers.push_back(std::move(b));
      }
    }
    s = fn(p);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<tensor::NamedTensors> ReadShardedBuffers(const std::string& dir_in) {
  const std::string dir = sharded::StripTrailingSlashes(dir_in);
  absl::StatusOr<sharded::Index> x = sharded::ReadIndex(dir);
  if (!x.ok()) return x.status();
  return sharded::ReadBuffers(dir, *x);
}

namespace {

// A checkpoint's index and the one reader its parameters' sources share. The
// reader caches the shard headers it has checked, so reads take turns.
struct SharedSliceReader {
  SharedSliceReader(const std::string& dir, sharded::Index index_in)
      : index(std::move(index_in)), reader(dir, index) {}
  const sharded::Index index;  // the reader's (by reference)
  std::mutex mu;
  sharded::SliceReader reader;  // guarded by mu
};

// One parameter of a sharded checkpoint (ShardedCheckpointInitSources).
class SavedParameterSource : public nn::InitSource {
 public:
  SavedParameterSource(std::shared_ptr<SharedSliceReader> shared, size_t param)
      : shared_(std::move(shared)), param_(param) {}
  const tensor::Shape& shape() const override { return shared_->index.params[param_].shape; }
  void Read(int64_t begin, tensor::Tensor& out) const override {
    const int64_t n = out.numel();
    // The reader reads f32: straight into `out` when it is f32.
    tensor::Tensor f32 =
        out.dtype() == tensor::Dtype::kF32 ? out.Reshape({n}) : tensor::Tensor::Empty({n});
    absl::Status s;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      s = shared_->reader.ReadRange(shared_->index.params[param_].value, begin, begin + n, f32);
    }
    OP_CHECK(s.ok(), "init_from_sharded", s.message());
    if (!f32.SharesStorageWith(out)) out.CopyFrom(f32.To(out.dtype()).View(out.shape()));
  }

 private:
  std::shared_ptr<SharedSliceReader> shared_;
  size_t param_;
};

// The shard file of WriteWholeParameters: each parameter read, checked
// against its spec, appended (value, then its buffers) and dropped; the
// slices' checksums go into `x`.
absl::Status WriteParameters(const std::string& path, const std::vector<WholeParameterSpec>& specs,
                             const std::function<absl::StatusOr<WholeParameter>(size_t)>& read,
                             const std::vector<std::string>& optimizer_buffers, sharded::Index& x) {
  std::vector<tensor::SafetensorsWriter::Decl> entries;
  for (const sharded::ParamRec& r : x.params) {
    if (r.numel == 0) continue;  // no slices, no tensors
    entries.push_back({r.value[0].tensor, tensor::Dtype::kF32, tensor::Shape({r.numel})});
    for (const std::string& b : r.has_state ? optimizer_buffers : std::vector<std::string>{}) {
      entries.push_back({r.state.at(b)[0].tensor, tensor::Dtype::kF32, tensor::Shape({r.numel})});
    }
  }
  absl::StatusOr<std::unique_ptr<tensor::SafetensorsWriter>> w = tensor::SafetensorsWriter::Create(
      path, std::move(entries), {{sharded::kIdKey, x.id}, {sharded::kShardKey, "0/1"}});
  if (!w.ok()) return w.status();
  auto append = [&](const tensor::Tensor& t, sharded::SliceRec& rec) {
    const tensor::Tensor flat = t.Contiguous().Reshape({t.numel()});
    rec.crcs = sharded::BlockCrcs(flat.data<float>(), flat.numel(), x.crc_block);
    return (*w)->Append(flat);
  };
  for (size_t i = 0; i < specs.size(); ++i) {
    const WholeParameterSpec& spec = specs[i];
    absl::StatusOr<WholeParameter> p = read(i);
    if (!p.ok()) return p.status();
    if (p->name != spec.name || !p->value.defined() || p->value.shape() != spec.shape ||
        p->has_state != spec.has_state || (spec.has_state && p->step != spec.step)) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", i, " ('", p->name, "') is not the one declared ('", spec.name,
                       "' ", spec.shape.ToString(), spec.has_state ? " with state" : "", ")"));
    }
    if (p->value.dtype() != tensor::Dtype::kF32 || !p->value.device().is_cpu()) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", p->name, "' must be f32 on the CPU; got ",
                       tensor::DtypeName(p->value.dtype()), " on ", p->value.device().ToString()));
    }
    sharded::ParamRec& r = x.params[i];
    const bool stored = r.numel > 0;  // a zero-element parameter has no slices
    absl::Status s = stored ? append(p->value, r.value[0]) : absl::OkStatus();
    if (!s.ok()) return s;
    if (!p->has_state) continue;
    if (p->buffers.size() != optimizer_buffers.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", p->name, "' has ", p->buffers.size(),
                       " optimizer buffers; the optimizer has ", optimizer_buffers.size()));
    }
    for (size_t k = 0; k < p->buffers.size(); ++k) {
      const tensor::Tensor& b = p->buffers[k];
      if (b.dtype() != tensor::Dtype::kF32 || b.shape() != p->value.shape() ||
          !b.device().is_cpu()) {
        return absl::InvalidArgumentError(
            absl::StrCat("optimizer ", optimizer_buffers[k], " of '", p->name, "' must be f32 ",
                         p->value.shape().ToString(), " on the CPU; got ",
                         tensor::DtypeName(b.dtype()), " ", b.shape().ToString()));
      }
      if (!stored) continue;
      s = append(b, r.state.at(optimizer_buffers[k])[0]);
      if (!s.ok()) return s;
    }
  }
  return (*w)->Finish();
}

}  // namespace

absl::StatusOr<nn::NamedInitSources> ShardedCheckpointInitSources(const std::string& dir_in) {
  const std::string dir = sharded::StripTrailingSlashes(dir_in);
  absl::StatusOr<sharded::Index> x = sharded::ReadIndex(dir);
  if (!x.ok()) return x.status();
  auto shared = std::make_shared<SharedSliceReader>(dir, *std::move(x));
  absl::Status files = shared->reader.CheckFiles();  // a missing or foreign file: now
  if (!files.ok()) return files;
  absl::StatusOr<tensor::NamedTensors> buffers = sharded::ReadBuffers(dir, shared->index);
  if (!buffers.ok()) return buffers.status();
  nn::NamedInitSources sources;
  for (size_t i = 0; i < shared->index.params.size(); ++i) {
    sources.emplace_back(shared->index.params[i].name,
                         std::make_shared<SavedParameterSource>(shared, i));
  }
  for (auto& source : nn::TensorInitSources(*std::move(buffers))) {
    sources.push_back(std::move(source));
  }
  return sources;
}

absl::Status WriteWholeParameters(const std::string& dir, const std::vector<WholeParameter>& params,
                                  const std::string& optimizer,
                                  const std::vector<std::string>& optimizer_buffers,
                                  const std::map<std::string, std::string>& extra,
                                  const tensor::NamedTensors& buffers) {
  std::vector<WholeParameterSpec> specs;
  for (const WholeParameter& p : params) {
    specs.push_back(
        {p.name, p.value.defined() ? p.value.shape() : tensor::Shape(), p.has_state, p.step});
  }
  return WriteWholeParameters(
      dir, specs, [&](size_t i) -> absl::StatusOr<WholeParameter> { return params[i]; }, optimizer,
      optimizer_buffers, extra, buffers);
}

absl::Status WriteWholeParameters(const std::string& dir_in,
                                  const std::vector<WholeParameterSpec>& specs,
                                  const std::function<absl::StatusOr<WholeParameter>(size_t)>& read,
                                  const std::string& optimizer,
                                  const std::vector<std::string>& optimizer_buffers,
                                  const std::map<std::string, std::string>& extra,
                                  const tensor::NamedTensors& buffers) {
  const std::string dir = sharded::StripTrailingSlashes(dir_in);
  if (dir.empty()) return absl::InvalidArgumentError("the checkpoint folder name is empty");
  absl::Status s = sharded::CheckReplaceable(dir);
  if (!s.ok()) return s;

  // The index: each parameter (and buffer) one slice [0, numel) of file 0,
  // its checksums filled in as it is written.
  sharded::Index x;
  x.id = sharded::NewCheckpointId();
  x.writer = "converted";
  x.strategy = "NONE";
  x.world_size = 1;
  x.optimizer = optimizer;
  x.buffers = optimizer_buffers;
  x.lr = "unknown";
  x.extra = extra;
  const std::string file = sharded::ShardFileName(0, 1);
  x.files.push_back(sharded::FileRec{file, 0});  // its size once written
  auto slice = [&](const std::string& kind, const std::string& name, int64_t numel) {
    sharded::SliceRec r;
    r.file = 0;
    r.tensor = sharded::SliceTensorName(kind, name, 0);
    r.begin = 0;
    r.end = numel;
    r.crcs.assign((numel + x.crc_block - 1) / x.crc_block, 0);
    return r;
  };
  std::set<int64_t> steps;
  for (const WholeParameterSpec& p : specs) {
    sharded::ParamRec r;
    r.name = p.name;
    r.shape = p.shape;
    r.numel = p.shape.numel();
    // One slice each, none for a zero-element parameter (as SaveSharded).
    if (r.numel > 0) r.value.push_back(slice(sharded::kValueKind, p.name, r.numel));
    if (p.has_state) {
      r.has_state = true;
      r.step = p.step;
      steps.insert(p.step);
      for (const std::string& b : optimizer_buffers) {
        std::vector<sharded::SliceRec>& slices = r.state[b];  // listed even when empty
        if (r.numel > 0) slices.push_back(slice(b, p.name, r.numel));
      }
    }
    x.params.push_back(std::move(r));
  }
  x.has_state = !steps.empty();
  x.step = steps.size() == 1 ? *steps.begin() : -1;
  s = sharded::ValidateIndex(x);
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("not a checkpoint: ", s.message()));

  // Written into "<dir>.tmp-<id>", then published onto dir.
  const std::string tmp = absl::StrCat(dir, ".tmp-", x.id);
  std::error_code ec;
  std::filesystem::create_directories(tensor::ParentFolder(dir), ec);
  if (::mkdir(tmp.c_str(), 0755) != 0) return sharded::ErrnoStatus("cannot create", tmp);
  const std::string path = absl::StrCat(tmp, "/", file);
  s = WriteParameters(path, specs, read, optimizer_buffers, x);
  if (s.ok()) {
    absl::StatusOr<sharded::BuffersFileRec> b = sharded::WriteBuffers(tmp, x.id, buffers);
    if (b.ok()) x.model_buffers = std::move(*b);
    s = b.status();
  }
  if (s.ok()) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      s = sharded::ErrnoStatus("cannot stat", path);
    } else {
      x.files[0].bytes = static_cast<int64_t>(st.st_size);
    }
  }
  if (s.ok()) {
    s = tensor::WriteFileDurably(absl::StrCat(tmp, "/", sharded::kIndexFile),
                                 sharded::IndexToJson(x));
  }
  if (s.ok()) {
    tensor::FsyncDir(tmp);
    s = sharded::Publish(tmp, dir, x.id);
  }
  if (!s.ok()) sharded::RemoveTree(tmp);
  return s;
}

}  // namespace dist
