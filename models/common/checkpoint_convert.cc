// Consolidating sharded checkpoints and reading models whole (see
// checkpoint_convert.h).
#include "models/common/checkpoint_convert.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "dist/host_name.h"
#include "dist/sharded_checkpoint.h"
#include "dist/sharded_checkpoint_folder.h"
#include "dist/sharded_checkpoint_offline.h"
#include "models/common/train_support.h"
#include "tensor/durable_file.h"
#include "tensor/safetensors.h"

namespace train {

namespace fs = std::filesystem;

absl::Status CheckFreshFolder(const std::string& dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (!fs::exists(st)) return absl::OkStatus();
  if (!fs::is_directory(st)) {
    return absl::AlreadyExistsError(absl::StrCat("'", dir, "' exists and is not a folder"));
  }
  if (!fs::is_empty(dir, ec)) {
    return absl::AlreadyExistsError(
        absl::StrCat("'", dir, "' is not empty; give a new folder to write the checkpoint to"));
  }
  return absl::OkStatus();
}

namespace {

// Removes what `dir` holds, not `dir`.
void EmptyFolder(const std::string& dir) {
  std::error_code ec;
  std::vector<fs::path> entries;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    entries.push_back(it->path());
  }
  for (const fs::path& p : entries) fs::remove_all(p, ec);
}

// The temporary folder's name beside `dir`: "<dir>.tmp-<what>@<host>-<pid>-
// <hex>" ('@' is in no host name: the name reads back unambiguously).
std::string TemporaryName(const std::string& dir, absl::string_view what,
                          const std::string& host) {
  return absl::StrCat(dir, ".tmp-", what, "@", host.empty() ? "?" : host, "-", ::getpid(), "-",
                      absl::Hex(std::random_device{}()));
}

constexpr char kWhatChars[] = "abcdefghijklmnopqrstuvwxyz-";

bool AllOf(absl::string_view s, const char* chars) {
  return !s.empty() && s.find_first_not_of(chars) == absl::string_view::npos;
}

// Removes the temporary folders beside `dir` that killed writes of this
// host left, saying each on stderr: a name TemporaryName gives with this
// host, whose pid is gone, and whose lock (the writer's flock on the folder,
// released when its process ends) is free. Those of other hosts, of a live
// process, or whose lock is held or cannot be taken (a file system without
// flock) are left alone.
void RemoveLeftoversOfKilledWrites(const std::string& dir, const std::string& host) {
  if (host.empty()) return;
  const fs::path path(dir);
  const std::string prefix = path.filename().string() + ".tmp-";
  std::error_code ec;
  for (fs::directory_iterator it(path.parent_path(), ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    absl::string_view rest = name;
    if (!absl::ConsumePrefix(&rest, prefix)) continue;
    // rest: "<what>@<host>-<pid>-<hex>".
    const size_t at = rest.rfind('@');
    if (at == absl::string_view::npos || !AllOf(rest.substr(0, at), kWhatChars)) continue;
    const std::vector<absl::string_view> tail = absl::StrSplit(rest.substr(at + 1), '-');
    if (tail.size() < 3) continue;
    const absl::string_view pid_text = tail[tail.size() - 2];
    int pid = 0;
    if (!AllOf(tail.back(), "0123456789abcdef") || !AllOf(pid_text, "0123456789") ||
        !absl::SimpleAtoi(pid_text, &pid) || pid <= 0) {
      continue;
    }
    const absl::string_view host_text =
        rest.substr(at + 1, rest.size() - (at + 1) - pid_text.size() - tail.back().size() - 2);
    if (host_text != host) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // running (or not ours to probe)
    std::error_code ignored;
    if (it->is_symlink(ignored) || !it->is_directory(ignored)) continue;
    const int fd = ::open(it->path().c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;
    const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;  // else held, or no flock here
    if (free) fs::remove_all(it->path(), ignored);
    ::close(fd);
    if (!free) continue;
    if (ignored) {
      std::fprintf(stderr, "warning: could not remove %s (the %s run that wrote it, pid %d on "
                   "this host, was killed): %s\n", it->path().c_str(),
                   std::string(rest.substr(0, at)).c_str(), pid, ignored.message().c_str());
      continue;
    }
    std::fprintf(stderr, "note: removed %s: the %s run that wrote it (pid %d on this host) was "
                 "killed\n", it->path().c_str(), std::string(rest.substr(0, at)).c_str(), pid);
  }
}

// write(folder), with `cleanup` run when it fails or throws.
absl::Status WriteOrClean(const std::function<absl::Status(const std::string&)>& write,
                          const std::string& folder, const std::function<void()>& cleanup) {
  absl::Status s;
  try {
    s = write(folder);
  } catch (...) {
    cleanup();
    throw;
  }
  if (!s.ok()) cleanup();
  return s;
}

}  // namespace

absl::Status WriteFreshFolder(const std::string& dir_in, absl::string_view what,
                              const std::function<absl::Status(const std::string& tmp)>& write) {
  if (dir_in.empty()) return absl::InvalidArgumentError("the folder to write has no name");
  if (!AllOf(what, kWhatChars)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "WriteFreshFolder: what='", what, "' must be lower-case letters and '-'"));
  }
  // "OUT/" and "OUT/." are OUT, whose temporary folder goes beside it, not
  // inside: operations use the absolute, normal path; messages the name given.
  const std::string named = dist::sharded::StripTrailingSlashes(dir_in);
  const std::string dir =
      dist::sharded::StripTrailingSlashes(fs::absolute(named).lexically_normal().string());
  absl::Status s = CheckFreshFolder(dir);
  if (!s.ok()) return absl::Status(s.code(), absl::StrReplaceAll(s.message(), {{dir, named}}));
  std::error_code ec;
  const fs::file_status link = fs::symlink_status(dir, ec);
  const bool exists = fs::exists(fs::status(dir, ec));
  if (fs::is_symlink(link) && !exists) {
    return absl::AlreadyExistsError(absl::StrCat("'", named, "' is a link to nothing"));
  }
  // A link to an empty folder, or a mount point: written in place (the
  // folder cannot be replaced), emptied again when the write fails.
  struct stat here {}, parent {};
  const bool mount_point = exists && ::stat(dir.c_str(), &here) == 0 &&
                           ::stat(tensor::ParentFolder(dir).c_str(), &parent) == 0 &&
                           here.st_dev != parent.st_dev;
  if (fs::is_symlink(link) || mount_point) {
    s = WriteOrClean(write, dir, [&] { EmptyFolder(dir); });
    if (s.ok()) tensor::FsyncDir(dir);
    return absl::Status(s.code(), absl::StrReplaceAll(s.message(), {{dir, named}}));
  }
  // Else written beside it under a name of its own, then renamed into place
  // (an empty folder there is replaced, its permissions kept), so that a
  // failed or killed write leaves nothing at `dir`.
  const std::string host = dist::HostName();
  RemoveLeftoversOfKilledWrites(dir, host);
  const std::string tmp = TemporaryName(dir, what, host);
  fs::create_directories(fs::path(tmp).parent_path(), ec);  // errors show at mkdir
  if (::mkdir(tmp.c_str(), exists ? here.st_mode & 07777 : 0755) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot create '", tmp, "': ", std::strerror(errno)));
  }
  // Locked while this process writes it (RemoveLeftoversOfKilledWrites);
  // best effort: a file system without flock leaves it unlocked.
  const int lock_fd = ::open(tmp.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (lock_fd >= 0) (void)::flock(lock_fd, LOCK_EX | LOCK_NB);
  const absl::Cleanup unlock = [lock_fd] {
    if (lock_fd >= 0) ::close(lock_fd);
  };
  const auto remove_tmp = [&] {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
  };
  s = WriteOrClean(write, tmp, remove_tmp);
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrReplaceAll(s.message(), {{tmp, named}, {dir, named}}));
  }
  // No folder at `dir` is replaced but the empty one found there: whatever
  // appeared meanwhile (another run's, even empty) is left as it is.
  int error = 0;
  if (exists && ::rmdir(dir.c_str()) != 0) error = errno;
  if (error == 0 &&
      ::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_NOREPLACE) != 0) {
    error = errno;
    if (error == EINVAL || error == ENOSYS) {  // a file system without RENAME_NOREPLACE
      error = ::rename(tmp.c_str(), dir.c_str()) == 0 ? 0 : errno;
    }
  }
  if (error == 0) {
    tensor::FsyncDir(tensor::ParentFolder(dir));
    return absl::OkStatus();
  }
  remove_tmp();
  if (error == EEXIST || error == ENOTEMPTY) {
    return absl::AlreadyExistsError(absl::StrCat(
        "'", named, "' was filled while it was being written; it was left as it is"));
  }
  return absl::UnavailableError(
      absl::StrCat("cannot rename '", tmp, "' to '", named, "': ", std::strerror(error)));
}

namespace {

// The two files of the single-process format in `dir`, streamed: both
// headers are declared from the index (every parameter whole in fp32, then
// the module buffers, as nn::StateDict orders them; per parameter with saved
// state, "<param>.step" (1) i64 and "<param>.<buffer>" f32), then each
// parameter read whole is appended and dropped, so one parameter and its
// optimizer state are held at a time (the buffers, small, are read first).
absl::Status WriteConsolidated(const std::string& sharded_dir,
                               const dist::ShardedCheckpointInfo& info, const TrainState& state,
                               const std::string& dir) {
  std::vector<tensor::SafetensorsWriter::Decl> model_entries, state_entries;
  for (size_t i = 0; i < info.params.size(); ++i) {
    const auto& [name, shape] = info.params[i];
    model_entries.push_back({name, tensor::Dtype::kF32, shape});
    if (!info.param_has_state[i]) continue;
    state_entries.push_back({name + ".step", tensor::Dtype::kI64, tensor::Shape({1})});
    for (const std::string& buffer : info.optimizer_buffers) {
      state_entries.push_back({name + "." + buffer, tensor::Dtype::kF32, shape});
    }
  }
  absl::StatusOr<tensor::NamedTensors> buffers = dist::ReadShardedBuffers(sharded_dir);
  if (!buffers.ok()) return buffers.status();
  const std::string id = NewSaveId();  // both files of one save
  std::map<std::string, std::string> metadata = CheckpointModelMetadata(state, id);
  std::vector<std::string> buffer_names;
  for (const auto& [name, t] : *buffers) {
    model_entries.push_back({name, t.dtype(), t.shape()});
    buffer_names.push_back(name);
  }
  if (!buffer_names.empty()) metadata[kBufferNamesKey] = absl::StrJoin(buffer_names, ",");
  absl::StatusOr<std::unique_ptr<tensor::SafetensorsWriter>> model =
      tensor::SafetensorsWriter::Create(dir + "/model.safetensors", std::move(model_entries),
                                        metadata);
  if (!model.ok()) return model.status();
  absl::StatusOr<std::unique_ptr<tensor::SafetensorsWriter>> optimizer =
      tensor::SafetensorsWriter::Create(dir + "/optimizer.safetensors", std::move(state_entries),
                                        CheckpointOptimizerMetadata(info.optimizer, id));
  if (!optimizer.ok()) return optimizer.status();
  absl::Status s = dist::ForEachWholeParameter(
      sharded_dir, /*with_optimizer_state=*/true,
      [&](const dist::WholeParameter& p) -> absl::Status {
        absl::Status st = (*model)->Append(p.value);
        if (!st.ok() || !p.has_state) return st;
        st = (*optimizer)->Append(tensor::Tensor::FromData<int64_t>({p.step}, {1}));
        for (const tensor::Tensor& buffer : p.buffers) {
          if (st.ok()) st = (*optimizer)->Append(buffer);
        }
        return st;
      });
  for (size_t i = 0; s.ok() && i < buffers->size(); ++i) s = (*model)->Append((*buffers)[i].second);
  if (s.ok()) s = (*model)->Finish();
  if (s.ok()) s = (*optimizer)->Finish();
  return s;
}

}  // namespace

absl::Status ConsolidateShardedCheckpoint(const std::string& sharded_dir,
                                          const std::string& out_dir) {
  if (!IsShardedCheckpoint(sharded_dir)) {
    std::error_code ec;
    const bool single = std::filesystem::exists(sharded_dir + "/model.safetensors", ec) &&
                        std::filesystem::exists(sharded_dir + "/optimizer.safetensors", ec);
    return absl::InvalidArgumentError(absl::StrCat(
        "'", sharded_dir, "' is not a sharded checkpoint (no index.json)",
        single ? ": it is a single-process one already (model.safetensors, as one process, DDP "
                 "and ZeRO-1 save), which every strategy and world size resumes from as it is"
               : ""));
  }
  absl::StatusOr<dist::ShardedCheckpointInfo> info = dist::ReadShardedCheckpointInfo(sharded_dir);
  if (!info.ok()) return info.status();
  absl::StatusOr<TrainState> state = TrainStateFromShardedExtra(info->extra, sharded_dir);
  if (!state.ok()) return state.status();
  // A failed write leaves nothing that looks like a checkpoint.
  return WriteFreshFolder(out_dir, "consolidate", [&](const std::string& tmp) {
    return WriteConsolidated(sharded_dir, *info, *state, tmp);
  });
}

absl::Status ShardSingleProcessCheckpoint(const std::string& single_dir,
                                          const std::string& out_dir,
                                          const std::vector<std::string>& buffer_names) {
  if (IsShardedCheckpoint(single_dir)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", single_dir, "' is already sharded (it holds index.json)"));
  }
  absl::StatusOr<CheckpointSummary> summary = ReadCheckpointSummary(single_dir);
  if (!summary.ok()) return summary.status();
  absl::Status s = CheckNotModelOnly(single_dir, "cannot be sharded (a sharded checkpoint resumes)");
  if (!s.ok()) return s;
  s = CheckFreshFolder(out_dir);
  if (!s.ok()) return s;
  // Headers and checksums first (streamed); every check on names, dtypes
  // and shapes before anything is written; then one parameter at a time.
  const std::string model_path = single_dir + "/model.safetensors";
  const std::string opt_path = single_dir + "/optimizer.safetensors";
  absl::StatusOr<tensor::SafetensorsHeader> model =
      tensor::ReadVerifiedSafetensorsHeader(model_path);
  if (!model.ok()) return model.status();
  absl::StatusOr<tensor::SafetensorsHeader> opt = tensor::ReadVerifiedSafetensorsHeader(opt_path);
  if (!opt.ok()) return opt.status();
  // Both files of one save: a mixed pair would become a clean sharded one.
  s = CheckSameSave(single_dir, model->metadata, opt->metadata);
  if (!s.ok()) return s;
  std::map<std::string, const tensor::SafetensorsEntry*> state;
  for (const tensor::SafetensorsEntry& e : opt->entries) state[e.name] = &e;
  // The module buffers: as the file names them (consolidated), else as given.
  std::set<std::string> buffer_set(buffer_names.begin(), buffer_names.end());
  auto listed = model->metadata.find(kBufferNamesKey);
  if (listed != model->metadata.end()) {
    std::set<std::string> recorded;
    for (absl::string_view name : absl::StrSplit(listed->second, ',', absl::SkipEmpty())) {
      recorded.insert(std::string(name));
    }
    if (!buffer_names.empty() && recorded != buffer_set) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--buffers=", absl::StrJoin(buffer_names, ","), " differs from the buffers '",
          model_path, "' names (", listed->second, "): leave --buffers out"));
    }
    buffer_set = std::move(recorded);
  }
  for (const std::string& name : buffer_set) {
    if (model->Find(name) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("'", model_path, "' has no entry '", name,
                                                     "' (named as a module buffer)"));
    }
    if (state.count(name + ".step") != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", name, "' is named as a module buffer but has optimizer state in '", opt_path, "'"));
    }
  }

  tensor::NamedTensors buffers;
  std::vector<dist::WholeParameterSpec> specs;
  for (const tensor::SafetensorsEntry& e : model->entries) {
    if (buffer_set.count(e.name) != 0) {  // small: read whole now
      absl::StatusOr<tensor::Tensor> t = tensor::ReadSafetensorsEntry(model_path, *model, e);
      if (!t.ok()) return t.status();
      buffers.emplace_back(e.name, *std::move(t));
      continue;
    }
    if (e.dtype != tensor::Dtype::kF32) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", model_path, "': '", e.name, "' is ", tensor::DtypeName(e.dtype),
          ": parameters are saved fp32, so it is a module buffer (BatchNorm's "
          "num_batches_tracked?); name the model's buffers (`checkpoint shard --buffers=...`, "
          "every one: running statistics are fp32) to write them as buffers"));
    }
    dist::WholeParameterSpec p;
    p.name = e.name;
    p.shape = e.shape;
    auto step = state.find(e.name + ".step");
    if (step != state.end()) {
      if (step->second->shape.numel() != 1) {
        return absl::DataLossError(
            absl::StrCat("'", opt_path, "': '", step->first, "' must hold one number"));
      }
      tensor::Tensor value = tensor::Tensor::Empty({1}, tensor::Dtype::kI64);
      s = tensor::ReadSafetensorsSlice(opt_path, *opt, step->first, 0, value);
      if (!s.ok()) return s;
      p.has_state = true;
      p.step = value.data<int64_t>()[0];
      state.erase(step);
      for (const std::string& key : summary->optimizer_buffers) {
        auto b = state.find(e.name + "." + key);
        if (b == state.end()) {
          return absl::DataLossError(
              absl::StrCat("'", opt_path, "' lacks '", e.name, ".", key, "'"));
        }
        if (b->second->shape.numel() != e.shape.numel()) {
          return absl::DataLossError(absl::StrCat("'", opt_path, "': '", b->first, "' is ",
                                                  b->second->shape.ToString(), ", its parameter ",
                                                  e.shape.ToString()));
        }
        state.erase(b);
      }
    }
    specs.push_back(std::move(p));
  }
  if (!state.empty()) {
    return absl::DataLossError(absl::StrCat("'", opt_path, "' holds '", state.begin()->first,
                                            "', which belongs to no parameter of the model"));
  }
  auto read = [&](size_t i) -> absl::StatusOr<dist::WholeParameter> {
    dist::WholeParameter p;
    p.name = specs[i].name;
    p.value = tensor::Tensor::Empty(specs[i].shape);  // f32
    absl::Status st = tensor::ReadSafetensorsSlice(model_path, *model, p.name, 0, p.value);
    if (!st.ok()) return st;
    p.has_state = specs[i].has_state;
    p.step = specs[i].step;
    for (const std::string& key :
         p.has_state ? summary->optimizer_buffers : std::vector<std::string>{}) {
      tensor::Tensor b = tensor::Tensor::Empty(specs[i].shape);  // f32, whatever was stored
      st = tensor::ReadSafetensorsSlice(opt_path, *opt, p.name + "." + key, 0, b);
      if (!st.ok()) return st;
      p.buffers.push_back(std::move(b));
    }
    return p;
  };
  return dist::WriteWholeParameters(out_dir, specs, read, summary->optimizer,
                                    summary->optimizer_buffers,
                                    ShardedCheckpointExtra(summary->state), buffers);
}

absl::StatusOr<RecordedCheckpoint> ReadRecordedCheckpoint(const std::string& path,
                                                          absl::string_view unreadable) {
  RecordedCheckpoint out;
  absl::StatusOr<std::string> step_dir = StepFolderOf(path);
  std::error_code ec;
  if (!step_dir.ok()) {
    // A checkpoint directory whose `latest` is broken is said as such.
    if (unreadable.empty() || fs::exists(fs::path(path) / "latest", ec)) return step_dir.status();
    return absl::InvalidArgumentError(absl::StrCat(unreadable, ": ", step_dir.status().message()));
  }
  out.step_dir = *step_dir;
  absl::StatusOr<CheckpointSummary> summary = ReadCheckpointSummary(out.step_dir);
  if (!summary.ok()) {
    if (unreadable.empty()) return summary.status();
    return absl::InvalidArgumentError(absl::StrCat(unreadable, ": ", summary.status().message()));
  }
  const std::map<std::string, std::string>& extra = summary->state.extra;
  auto config = extra.find("config");
  if (config == extra.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        out.step_dir, " records no model configuration: not a checkpoint of a train binary"));
  }
  out.config = config->second;
  auto tokenizer = extra.find("tokenizer");
  if (tokenizer != extra.end()) out.tokenizer = tokenizer->second;
  out.description = absl::StrCat("checkpoint ", out.step_dir, " (step ", summary->state.step, ")");
  out.loader_state = summary->state.loader_state;
  return out;
}

absl::StatusOr<CheckpointSummary> ReadCheckpointSummary(const std::string& step_dir) {
  CheckpointSummary out;
  std::error_code ec;
  if (!fs::is_directory(step_dir, ec)) {
    return absl::NotFoundError(absl::StrCat("'", step_dir, "' is not a folder"));
  }
  out.sharded = IsShardedCheckpoint(step_dir);
  if (out.sharded) {
    absl::StatusOr<dist::ShardedCheckpointInfo> info = dist::ReadShardedCheckpointInfo(step_dir);
    if (!info.ok()) return info.status();
    absl::StatusOr<TrainState> state = TrainStateFromShardedExtra(info->extra, step_dir);
    if (!state.ok()) return state.status();
    out.state = std::move(*state);
    out.params = info->params;
    for (const dist::ShardedCheckpointInfo::Buffer& b : info->buffers) {
      out.buffers.push_back({b.name, b.shape, b.dtype});
    }
    out.optimizer = info->optimizer;
    out.optimizer_buffers = info->optimizer_buffers;
    out.has_optimizer_state = info->has_optimizer_state;
    out.optimizer_step = info->optimizer_step;
    out.writer = info->writer;
    out.strategy = info->strategy;
    out.world_size = info->world_size;
    out.units = info->units;
  } else {
    const std::string model_path = step_dir + "/model.safetensors";
    const std::string opt_path = step_dir + "/optimizer.safetensors";
    absl::StatusOr<tensor::SafetensorsHeader> model = tensor::ReadSafetensorsHeader(model_path);
    if (!model.ok()) return model.status();
    absl::StatusOr<TrainState> state = TrainStateFromMetadata(model->metadata, model_path);
    if (!state.ok()) return state.status();
    out.state = std::move(*state);
    std::set<std::string> buffer_names;
    auto listed = model->metadata.find(kBufferNamesKey);
    if (listed != model->metadata.end()) {
      for (absl::string_view name : absl::StrSplit(listed->second, ',', absl::SkipEmpty())) {
        buffer_names.insert(std::string(name));
      }
    }
    for (const tensor::SafetensorsEntry& e : model->entries) {
      if (buffer_names.count(e.name) != 0 || e.dtype != tensor::Dtype::kF32) {
        out.buffers.push_back({e.name, e.shape, e.dtype});
      } else {
        out.params.emplace_back(e.name, e.shape);
      }
    }
    out.model_only = IsModelOnly(step_dir);
    absl::StatusOr<tensor::SafetensorsHeader> opt =
        out.model_only ? tensor::SafetensorsHeader{} : tensor::ReadSafetensorsHeader(opt_path);
    if (!opt.ok()) return opt.status();
    auto name = opt->metadata.find("optimizer");
    if (name != opt->metadata.end()) out.optimizer = name->second;
    // "<param>.step" (one integer) and "<param>.<buffer>" per parameter with state.
    bool steps_equal = true;
    for (const auto& [param, shape] : out.params) {
      const tensor::SafetensorsEntry* step = opt->Find(param + ".step");
      if (step == nullptr) continue;
      tensor::Tensor value = tensor::Tensor::Empty({1}, tensor::Dtype::kI64);
      absl::Status s = tensor::ReadSafetensorsSlice(opt_path, *opt, step->name, 0, value);
      if (!s.ok()) return s;
      const int64_t n = value.data<int64_t>()[0];
      if (!out.has_optimizer_state) {
        out.has_optimizer_state = true;
        out.optimizer_step = n;
        for (const tensor::SafetensorsEntry& e : opt->entries) {
          const std::string prefix = param + ".";
          if (e.name.size() <= prefix.size() || e.name.compare(0, prefix.size(), prefix) != 0) {
            continue;
          }
          const std::string key = e.name.substr(prefix.size());
          if (key != "step" && key.find('.') == std::string::npos) {
            out.optimizer_buffers.push_back(key);
          }
        }
      } else if (n != out.optimizer_step) {
        steps_equal = false;
      }
    }
    if (!steps_equal) out.optimizer_step = -1;
  }
  for (const fs::directory_entry& e : fs::directory_iterator(step_dir, ec)) {
    if (e.is_regular_file(ec)) {
      out.files.emplace_back(e.path().filename().string(), e.file_size(ec));
    }
  }
  std::sort(out.files.begin(), out.files.end());
  return out;
}

absl::StatusOr<tensor::NamedTensors> ReadCheckpointModel(const std::string& step_dir) {
  if (IsShardedCheckpoint(step_dir)) {
    tensor::NamedTensors model;
    absl::Status s = dist::ForEachWholeParameter(step_dir, /*with_optimizer_state=*/false,
                                                 [&](const dist::WholeParameter& p) {
                                                   model.emplace_back(p.name, p.value);
                                                   return absl::OkStatus();
                                                 });
    if (!s.ok()) return s;
    absl::StatusOr<tensor::NamedTensors> buffers = dist::ReadShardedBuffers(step_dir);
    if (!buffers.ok()) return buffers.status();
    for (auto& entry : *buffers) model.push_back(std::move(entry));
    return model;
  }
  absl::StatusOr<tensor::SafetensorsFile> f =
      tensor::ReadSafetensors(step_dir + "/model.safetensors");
  if (!f.ok()) return f.status();
  return std::move(f->tensors);
}

absl::StatusOr<nn::NamedInitSources> OpenCheckpointModel(const std::string& step_dir) {
  if (IsShardedCheckpoint(step_dir)) return dist::ShardedCheckpointInitSources(step_dir);
  return nn::SafetensorsInitSources(step_dir + "/model.safetensors");
}

}  // namespace train
