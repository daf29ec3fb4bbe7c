// Sharded checkpoints: the save / load protocols (see the header) over the
// format of sharded_checkpoint_index.h: which rank writes and reads what
// (the FSDP and ZeRO-1 mappings onto flat buffers), the phases and their
// all-gathered statuses, and staging so that a failed load changes nothing.
#include "dist/sharded_checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "dist/sharded_checkpoint_buffers.h"
#include "dist/sharded_checkpoint_exchange.h"
#include "dist/sharded_checkpoint_folder.h"
#include "dist/sharded_checkpoint_index.h"
#include "dist/sharded_checkpoint_participant.h"
#include "dist/sharded_checkpoint_reader.h"
#include "tensor/durable_file.h"
#include "tensor/guarded.h"
#include "tensor/memory_ledger.h"
#include "tensor/safetensors.h"

namespace dist {
namespace {

using sharded::BlockCrcs;
using sharded::BuffersFileRec;
using sharded::CheckReplaceable;
using sharded::ErrnoStatus;
using sharded::AgreeOnCheck;
using sharded::Exchange;
using sharded::CheckFsdpGroup;
using sharded::CheckZero1Group;
using sharded::FileRec;
using sharded::FlatLayout;
using sharded::FromFsdp;
using sharded::FromZero1;
using sharded::Hex32;
using sharded::Index;
using sharded::IndexToJson;
using sharded::kDefaultCrcBlock;
using sharded::kIdKey;
using sharded::kIndexFile;
using sharded::kShardKey;
using sharded::kValueKind;
using sharded::NewCheckpointId;
using sharded::ParamRec;
using sharded::Participant;
using tensor::ParentFolder;
using sharded::Publish;
using sharded::ReadIndex;
using sharded::RemoveTree;
using sharded::SameCheckpointOnEveryRank;
using sharded::ShardFileName;
using sharded::SliceReader;
using sharded::SliceRec;
using sharded::SliceTensorName;
using sharded::StripTrailingSlashes;
using sharded::ValidateIndex;
using tensor::FsyncDir;
using tensor::Tensor;
using tensor::WriteFileDurably;

std::mutex g_hooks_mu;
std::function<absl::Status(int)> g_write_fault;  // guarded by g_hooks_mu

#define SC_RETURN_IF_ERROR(expr)   \
  do {                             \
    absl::Status _sc_s = (expr);   \
    if (!_sc_s.ok()) return _sc_s; \
  } while (0)

// Save phase 1 on a writing rank: the shard file, and a manifest of what it
// holds (tab-separated lines):
//   F <file index> <file name> <bytes>
//   R <ref> <step or -1>
//   T <param> <step>
//   S <kind> <param> <begin> <end> <tensor> <crc>[,<crc>...]
absl::StatusOr<std::string> WriteShard(const std::string& tmp_dir, const Participant& p,
                                       const optim::Optimizer& opt, const std::string& id,
                                       int64_t crc_block, int rank) {
  const std::vector<std::string> keys = opt.BufferNames();
  std::map<std::string, Tensor> state;
  for (auto& [name, t] : opt.StateTensors()) state[name] = t;
  tensor::NamedTensors tensors;
  std::string manifest;
  auto add = [&](const std::string& kind, const std::string& param, int64_t begin,
                 const Tensor& device_t) {
    const Tensor t = device_t.To(tensor::Device::Cpu());  // shards on a GPU: a host copy
    const std::string name = SliceTensorName(kind, param, begin);
    const int64_t n = t.numel();
    std::vector<std::string> crcs;
    for (uint32_t crc : BlockCrcs(t.data<float>(), n, crc_block)) crcs.push_back(Hex32(crc));
    absl::StrAppend(&manifest, "S\t", kind, "\t", param, "\t", begin, "\t", begin + n, "\t", name,
                    "\t", absl::StrJoin(crcs, ","), "\n");
    tensors.emplace_back(name, t);
  };
  for (const FlatLayout& L : p.layouts) {
    const bool has = opt.HasState(L.ref);
    std::vector<Tensor> bufs;
    if (has) {
      for (const std::string& k : keys) {
        auto it = state.find(absl::StrCat(L.ref, ".", k));
        if (it == state.end()) {
          return absl::InternalError(
              absl::StrCat("optimizer state '", L.ref, ".", k, "' is missing"));
        }
        const Tensor& t = it->second;
        if (t.dtype() != tensor::Dtype::kF32 || t.numel() != L.shard_numel || !t.is_contiguous()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "optimizer state '", L.ref, ".", k, "' has shape ", t.shape().ToString(),
              " but the shard has ", L.shard_numel, " elements (an optimizer of another model?)"));
        }
        bufs.push_back(t.Reshape({L.shard_numel}));
      }
    }
    const int64_t step = has ? opt.StepCount(L.ref) : -1;
    absl::StrAppend(&manifest, "R\t", L.ref, "\t", step, "\n");
    const int64_t sb = L.shard_begin;
    const int64_t se = L.shard_begin + L.shard_numel;
    for (const FlatLayout::Entry& e : L.entries) {
      const int64_t lo = std::max(sb, e.offset);
      const int64_t hi = std::min(se, e.offset + e.numel);
      if (lo >= hi) continue;
      add(kValueKind, e.name, lo - e.offset, L.shard.Narrow(0, lo - sb, hi - lo));
      // A frozen parameter's state is not saved, in a unit or bucket of trainable ones too:
      // its elements were never stepped, so loading them unfrozen at the flat buffer's step
      // count would start AdamW on zero moments with its bias correction spent (first
      // updates about 3x lr). Without state, unfreezing is refused naming the way (Stage).
      if (e.frozen) continue;
      for (size_t k = 0; k < bufs.size(); ++k) {
        add(keys[k], e.name, lo - e.offset, bufs[k].Narrow(0, lo - sb, hi - lo));
      }
      if (has) absl::StrAppend(&manifest, "T\t", e.name, "\t", step, "\n");
    }
  }
  {
    std::function<absl::Status(int)> fault;
    {
      std::lock_guard<std::mutex> lock(g_hooks_mu);
      fault = g_write_fault;
    }
    if (fault) SC_RETURN_IF_ERROR(fault(rank));
  }
  const std::string file = ShardFileName(p.file_index, p.num_files);
  const std::string path = absl::StrCat(tmp_dir, "/", file);
  SC_RETURN_IF_ERROR(tensor::WriteSafetensors(
      path, tensors, {{kIdKey, id}, {kShardKey, absl::StrCat(p.file_index, "/", p.num_files)}}));
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus("cannot stat", path);
  return absl::StrCat("F\t", p.file_index, "\t", file, "\t", static_cast<int64_t>(st.st_size), "\n",
                      manifest);
}

// Rank 0: the index from every writer's manifest and this rank's view of the
// parameters (every rank knows every parameter's name and shape).
absl::StatusOr<Index> AssembleIndex(const Participant& p, const optim::Optimizer& opt,
                                    const std::vector<std::string>& manifests, int world_size,
                                    const std::string& id, int64_t crc_block,
                                    const std::map<std::string, std::string>& extra) {
  Index x;
  x.id = id;
  x.writer = p.writer;
  x.strategy = p.strategy;
  x.world_size = world_size;
  x.units = p.units;
  x.crc_block = crc_block;
  x.optimizer = opt.name();
  x.buffers = opt.BufferNames();
  x.lr = absl::StrFormat("%.17g", opt.lr());
  x.extra = extra;
  x.files.resize(p.num_files);
  std::vector<bool> seen_file(p.num_files, false);
  std::map<std::string, size_t> pos;
  for (const FlatLayout& L : p.layouts) {
    for (const FlatLayout::Entry& e : L.entries) {
      if (pos.count(e.name)) {
        return absl::InternalError(absl::StrCat("parameter '", e.name, "' is in two units"));
      }
      pos[e.name] = x.params.size();
      ParamRec r;
      r.name = e.name;
      r.shape = e.shape;
      r.numel = e.numel;
      x.params.push_back(std::move(r));
    }
  }
  std::set<int64_t> ref_steps;
  bool any_state = false;
  std::map<std::string, std::set<int64_t>> param_steps;
  for (size_t r = 0; r < manifests.size(); ++r) {
    int file = -1;
    for (absl::string_view line : absl::StrSplit(manifests[r], '\n', absl::SkipEmpty())) {
      std::vector<std::string> f = absl::StrSplit(line, '\t');
      auto bad = [&] {
        return absl::InternalError(
            absl::StrCat("rank ", r, " sent a bad manifest line '", line, "'"));
      };
      if (f[0] == "F" && f.size() == 4) {
        int64_t bytes = 0;
        if (!absl::SimpleAtoi(f[1], &file) || file < 0 || file >= p.num_files || seen_file[file] ||
            !absl::SimpleAtoi(f[3], &bytes)) {
          return bad();
        }
        seen_file[file] = true;
        x.files[file] = FileRec{f[2], bytes};
      } else if (f[0] == "R" && f.size() == 3) {
        int64_t step = 0;
        if (!absl::SimpleAtoi(f[2], &step)) return bad();
        if (step >= 0) {
          any_state = true;
          ref_steps.insert(step);
        }
      } else if (f[0] == "T" && f.size() == 3) {
        int64_t step = 0;
        if (!absl::SimpleAtoi(f[2], &step) || pos.count(f[1]) == 0) return bad();
        param_steps[f[1]].insert(step);
      } else if (f[0] == "S" && f.size() == 7 && file >= 0) {
        auto it = pos.find(f[2]);
        SliceRec s;
        s.file = file;
        s.tensor = f[5];
        if (it == pos.end() || !absl::SimpleAtoi(f[3], &s.begin) ||
            !absl::SimpleAtoi(f[4], &s.end)) {
          return bad();
        }
        for (absl::string_view c : absl::StrSplit(f[6], ',', absl::SkipEmpty())) {
          uint32_t v = 0;
          if (!absl::SimpleHexAtoi(c, &v)) return bad();
          s.crcs.push_back(v);
        }
        ParamRec& rec = x.params[it->second];
        if (f[1] == kValueKind) {
          rec.value.push_back(std::move(s));
        } else {
          rec.state[f[1]].push_back(std::move(s));
        }
      } else {
        return bad();
      }
    }
  }
  for (int i = 0; i < p.num_files; ++i) {
    if (!seen_file[i]) return absl::InternalError(absl::StrCat("no rank wrote shard file ", i));
  }
  x.has_state = any_state;
  x.step = ref_steps.size() == 1 ? *ref_steps.begin() : -1;
  for (ParamRec& rec : x.params) {
    auto it = param_steps.find(rec.name);
    if (it == param_steps.end()) continue;
    if (it->second.size() != 1) {
      return absl::FailedPreconditionError(absl::StrCat("the ranks holding parameter '", rec.name,
                                                        "' disagree on its optimizer step (",
                                                        absl::StrJoin(it->second, ", "), ")"));
    }
    rec.has_state = true;
    rec.step = *it->second.begin();
  }
  absl::Status s = ValidateIndex(x);
  if (!s.ok()) {
    return absl::InternalError(
        absl::StrCat("the ranks' shards do not form a checkpoint: ", s.message()));
  }
  return x;
}

int64_t CrcBlockForSave();

// How errors name a save or load: "save_sharded '<dir>'".
std::string OpWhat(const char* op, const std::string& dir) {
  return absl::StrCat(op, " '", StripTrailingSlashes(dir), "'");
}

absl::Status SaveImpl(const std::string& dir_in, const Participant& p, const optim::Optimizer& opt,
                      ProcessGroup& pg, const std::map<std::string, std::string>& extra) {
  const std::string dir = StripTrailingSlashes(dir_in);
  const std::string what = OpWhat("save_sharded", dir);
  const int rank = pg.rank();
  const int64_t crc_block = CrcBlockForSave();

  // Phase 0 (rank 0): check the target, create "<dir>.tmp-<id>", share the id.
  std::string id;
  absl::Status s;
  if (rank == 0) {
    id = NewCheckpointId();
    if (dir.empty()) s = absl::InvalidArgumentError("the checkpoint folder name is empty");
    if (s.ok()) s = CheckReplaceable(dir);
    if (s.ok()) {
      std::error_code ec;
      std::filesystem::create_directories(ParentFolder(dir), ec);
      if (ec) {
        s = absl::UnavailableError(
            absl::StrCat("cannot create '", ParentFolder(dir), "': ", ec.message()));
      }
    }
    if (s.ok() && ::mkdir(absl::StrCat(dir, ".tmp-", id).c_str(), 0755) != 0) {
      s = ErrnoStatus("cannot create", absl::StrCat(dir, ".tmp-", id));
    }
  }
  absl::StatusOr<std::vector<std::string>> got = Exchange(pg, s, id, what);
  if (!got.ok()) {
    if (rank == 0 && s.ok()) RemoveTree(absl::StrCat(dir, ".tmp-", id));
    return got.status();
  }
  id = (*got)[0];
  const std::string tmp = absl::StrCat(dir, ".tmp-", id);

  // Phase 1: writers write their shard files; rank 0 the buffers' file.
  std::string manifest;
  BuffersFileRec buffers;
  s = absl::OkStatus();
  if (rank == 0) {
    tensor::NamedTensors named;
    for (const auto& [name, t] : p.buffers) named.emplace_back(name, *t);
    absl::StatusOr<BuffersFileRec> b = tensor::Guarded(
        [&] { return sharded::WriteBuffers(tmp, id, named); }, "writing the buffers: ");
    if (b.ok()) buffers = std::move(*b);
    s = b.status();
  }
  if (p.writes && s.ok()) {
    absl::StatusOr<std::string> m =
        tensor::Guarded([&] { return WriteShard(tmp, p, opt, id, crc_block, rank); },
                        "writing this rank's shard: ");
    if (m.ok()) {
      manifest = std::move(*m);
    } else {
      s = m.status();
    }
  }
  got = Exchange(pg, s, manifest, what);
  if (!got.ok()) {
    if (rank == 0) RemoveTree(tmp);
    return got.status();
  }

  // Phase 2 (rank 0): index.json, then the folder goes live.
  s = absl::OkStatus();
  if (rank == 0) {
    absl::StatusOr<Index> index = tensor::Guarded(
        [&] { return AssembleIndex(p, opt, *got, pg.size(), id, crc_block, extra); },
        "assembling index.json: ");
    if (!index.ok()) s = index.status();
    if (s.ok()) index->model_buffers = std::move(buffers);
    if (s.ok()) s = WriteFileDurably(absl::StrCat(tmp, "/", kIndexFile), IndexToJson(*index));
    if (s.ok()) {
      FsyncDir(tmp);
      s = Publish(tmp, dir, id);
    }
    if (s.ok()) {
      FsyncDir(ParentFolder(dir));
    } else {
      RemoveTree(tmp);
    }
  }
  // Also the final barrier: no rank returns before the checkpoint is live.
  got = Exchange(pg, s, "", what);
  return got.ok() ? absl::OkStatus() : got.status();
}

// Load phase 1 on every rank: everything this rank will hold, in staging
// buffers, checked against the model and the optimizer.
struct Staged {
  std::vector<Tensor> values;                // per layout
  std::vector<std::vector<Tensor>> buffers;  // per layout, per key (empty: no state)
  std::vector<int64_t> steps;                // per layout
  bool any_state = false;
  std::vector<Tensor> model_buffers;  // per Participant::buffers entry, on the CPU
};

// The way out Stage's refusals of the optimizer state name.
constexpr char kLoadWeightsAlone[] =
    "load the weights alone with load_optimizer_state = false, as the train binaries' "
    "--init_from does";

absl::StatusOr<Staged> Stage(const std::string& dir, const Index& x, const Participant& p,
                             const optim::Optimizer& opt, const ShardedLoadOptions& options) {
  // The model's parameters against the checkpoint's.
  std::vector<std::string> missing, shape_errors;
  std::set<std::string> model_names;
  for (const FlatLayout& L : p.layouts) {
    for (const FlatLayout::Entry& e : L.entries) {
      model_names.insert(e.name);
      auto it = x.by_name.find(e.name);
      if (it == x.by_name.end()) {
        missing.push_back(e.name);
      } else if (x.params[it->second].shape != e.shape) {
        shape_errors.push_back(
            absl::StrCat("'", e.name, "' is ", x.params[it->second].shape.ToString(),
                         " in the checkpoint but ", e.shape.ToString(), " in the model"));
      }
    }
  }
  auto first_few = [](const std::vector<std::string>& v) {
    std::vector<std::string> head(v.begin(), v.begin() + std::min<size_t>(v.size(), 5));
    return absl::StrCat(absl::StrJoin(head, ", "),
                        v.size() > 5 ? absl::StrCat(", ... (", v.size(), " in all)") : "");
  };
  if (!missing.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameters of the model missing from the checkpoint: ", first_few(missing)));
  }
  std::vector<std::string> unexpected;
  for (const ParamRec& r : x.params) {
    if (model_names.count(r.name) == 0) unexpected.push_back(r.name);
  }
  if (!unexpected.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameters in the checkpoint that the model lacks: ", first_few(unexpected)));
  }
  if (!shape_errors.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("shape mismatch: ", first_few(shape_errors)));
  }
  const bool load_opt = options.load_optimizer_state;
  if (load_opt) {
    const std::vector<std::string> keys = opt.BufferNames();
    if (x.optimizer != opt.name() || x.buffers != keys) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the checkpoint's optimizer state is ", x.optimizer, " (", absl::StrJoin(x.buffers, ", "),
          ") but the optimizer is ", opt.name(), " (", absl::StrJoin(keys, ", "),
          "); load with load_optimizer_state = false to take the model only (the train "
          "binaries: resume with the run's --optimizer and --momentum, or take the weights "
          "alone with --init_from)"));
    }
  }

  // The buffers (every rank reads them whole), then each layout's optimizer
  // step: its parameters' common step.
  Staged st;
  if (!(options.keep_buffers_missing_from_checkpoint && x.model_buffers.tensors.empty())) {
    absl::StatusOr<std::vector<Tensor>> buffers = sharded::StageBuffers(dir, x, p.buffers);
    if (!buffers.ok()) return buffers.status();
    st.model_buffers = std::move(*buffers);
  }  // else none staged: the model keeps its own
  std::vector<bool> has(p.layouts.size(), false);
  if (load_opt) {
    int with = 0, training = 0;
    std::string with_state, without_state;  // a flat parameter of each kind, for errors
    for (size_t i = 0; i < p.layouts.size(); ++i) {
      const FlatLayout& L = p.layouts[i];
      if (!L.trains) {  // no optimizer state to form
        st.steps.push_back(0);
        continue;
      }
      ++training;
      std::string first_name;
      int64_t step = -1;
      bool seen = false, state = false;
      for (const FlatLayout::Entry& e : L.entries) {
        // Frozen parameters' state (zeros, if any) does not decide the step.
        if (e.numel == 0 || e.frozen) continue;
        const ParamRec& r = x.params[x.by_name.at(e.name)];
        if (!seen) {
          seen = true;
          state = r.has_state;
          step = r.step;
          first_name = e.name;
          continue;
        }
        if (r.has_state != state) {
          return absl::FailedPreconditionError(absl::StrCat(
              "cannot form the optimizer state of '", L.ref, "': parameter '",
              state ? first_name : e.name, "' has optimizer state in the checkpoint but '",
              state ? e.name : first_name,
              "' has none (a parameter frozen when it was saved has none, as has one that no "
              "backward reached under DDP or in one process, which its optimizer skipped): ",
              kLoadWeightsAlone, " (or, for a frozen one, keep it frozen)"));
        }
        if (state && r.step != step) {
          return absl::FailedPreconditionError(
              absl::StrCat("cannot form the optimizer state of '", L.ref, "': parameters '",
                           first_name, "' (step ", step, ") and '", e.name, "' (step ", r.step,
                           ") were stepped a different number of times (likely one that some "
                           "step's backward did not reach, under DDP or in one process, was "
                           "skipped then); one flat parameter holds one step count: ",
                           kLoadWeightsAlone));
        }
      }
      if (!seen) {  // a flat buffer without elements: the checkpoint's common step
        state = x.has_state;
        step = x.step;
        if (state && step < 0) {
          return absl::FailedPreconditionError(absl::StrCat(
              "cannot form the optimizer state of '", L.ref,
              "' (no parameters): the checkpoint's parameters have different step counts "
              "(likely some were skipped, under DDP or in one process, in steps whose "
              "backward did not reach them): ",
              kLoadWeightsAlone));
        }
      }
      has[i] = state;
      st.steps.push_back(state ? step : 0);
      with += state ? 1 : 0;
      (state ? with_state : without_state) = L.ref;
    }
    if (with != 0 && with != training) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the checkpoint holds optimizer state for some flat parameters only ('", with_state,
          "' has, '", without_state, "' has none: its parameters were frozen when saved, or "
          "no backward reached them under DDP or in one process, so the optimizer skipped "
          "them): ",
          kLoadWeightsAlone));
    }
    st.any_state = with > 0;
  }

  // Read what overlaps this rank's shards.
  SliceReader reader(dir, x);
  const std::vector<std::string> keys = opt.BufferNames();
  tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kTemporaries);
  for (size_t i = 0; i < p.layouts.size(); ++i) {
    const FlatLayout& L = p.layouts[i];
    st.values.push_back(Tensor::Zeros({L.shard_numel}));
    st.buffers.emplace_back();
    if (has[i]) {
      for (size_t k = 0; k < keys.size(); ++k) {
        st.buffers.back().push_back(Tensor::Zeros({L.shard_numel}));
      }
    }
    const int64_t sb = L.shard_begin;
    const int64_t se = L.shard_begin + L.shard_numel;
    for (const FlatLayout::Entry& e : L.entries) {
      const int64_t lo = std::max(sb, e.offset);
      const int64_t hi = std::min(se, e.offset + e.numel);
      if (lo >= hi) continue;
      const ParamRec& r = x.params[x.by_name.at(e.name)];
      SC_RETURN_IF_ERROR(reader.ReadRange(r.value, lo - e.offset, hi - e.offset,
                                          st.values[i].Narrow(0, lo - sb, hi - lo)));
      if (e.frozen && !r.has_state) continue;  // a frozen parameter's state stays zero
      for (size_t k = 0; k < st.buffers[i].size(); ++k) {
        SC_RETURN_IF_ERROR(reader.ReadRange(r.state.at(keys[k]), lo - e.offset, hi - e.offset,
                                            st.buffers[i][k].Narrow(0, lo - sb, hi - lo)));
      }
    }
  }
  return st;
}

// Load phase 2: nothing of the checks can fail any more.
absl::Status Commit(Participant& p, Staged& st, optim::Optimizer& opt,
                    const ShardedLoadOptions& options) {
  if (options.load_optimizer_state) {
    if (st.any_state) {
      const std::vector<std::string> keys = opt.BufferNames();
      optim::NamedTensors named;
      std::vector<optim::ParamRef> refs;
      for (size_t i = 0; i < p.layouts.size(); ++i) {
        const FlatLayout& L = p.layouts[i];
        if (!L.trains) continue;
        const int64_t step = st.steps[i];
        named.emplace_back(absl::StrCat(L.ref, ".step"),
                           Tensor::FromData<int64_t>(absl::MakeConstSpan(&step, 1), {1}));
        for (size_t k = 0; k < keys.size(); ++k) {
          named.emplace_back(absl::StrCat(L.ref, ".", keys[k]),
                             st.buffers[i][k].Reshape(L.param_ref.param.shape()));
        }
        refs.push_back(L.param_ref);
      }
      absl::Status s;
      {
        tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kOptimizerState);
        s = opt.LoadStateTensors(named, refs);
      }
      if (!s.ok()) return s;
    } else {
      opt.ClearState();
    }
  }
  for (size_t i = 0; i < p.layouts.size(); ++i) {
    Tensor dst = p.layouts[i].shard;
    dst.CopyFrom(st.values[i].Reshape(dst.shape()));
  }
  if (!st.model_buffers.empty()) sharded::CommitBuffers(st.model_buffers, p.buffers);
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, std::string>> LoadImpl(
    const std::string& dir_in, Participant& p, optim::Optimizer& opt, ProcessGroup& pg,
    const ShardedLoadOptions& options, const std::function<absl::Status()>& after_commit) {
  const std::string dir = StripTrailingSlashes(dir_in);
  const std::string what = OpWhat("load_sharded", dir);
  absl::StatusOr<Index> index = ReadIndex(dir);
  absl::StatusOr<Staged> staged =
      index.ok() ? tensor::Guarded([&] { return Stage(dir, *index, p, opt, options); },
                                   "staging this rank's shard: ")
                 : absl::StatusOr<Staged>(index.status());
  // Every rank staged the same checkpoint: ranks given other folders, or
  // one that read an index.json being replaced, all refuse before any commit.
  absl::StatusOr<std::vector<std::string>> got =
      Exchange(pg, staged.status(), staged.ok() ? index->id : "", what);
  if (!got.ok()) return got.status();
  if (absl::Status same = SameCheckpointOnEveryRank(*got, what); !same.ok()) return same;
  absl::Status s = tensor::Guarded([&] { return Commit(p, *staged, opt, options); },
                                   "committing the loaded state: ");
  got = Exchange(pg, s, "", absl::StrCat(what, " (the ranks may now disagree on the state)"));
  if (!got.ok()) return got.status();
  if (after_commit) {
    s = after_commit();
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  }
  return index->extra;
}

std::mutex g_block_mu;
int64_t g_crc_block = kDefaultCrcBlock;  // guarded by g_block_mu

int64_t CrcBlockForSave() {
  std::lock_guard<std::mutex> lock(g_block_mu);
  return g_crc_block;
}

}  // namespace

namespace internal {
void SetShardWriteFaultForTesting(std::function<absl::Status(int rank)> fault) {
  std::lock_guard<std::mutex> lock(g_hooks_mu);
  g_write_fault = std::move(fault);
}
void SetCrcBlockElementsForTesting(int64_t elements) {
  std::lock_guard<std::mutex> lock(g_block_mu);
  g_crc_block = elements > 0 ? elements : kDefaultCrcBlock;
}
}  // namespace internal

absl::Status SaveSharded(const std::string& dir, FullyShardedModel& fsdp,
                         const optim::Optimizer& optimizer, ProcessGroup& pg,
                         const std::map<std::string, std::string>& extra) {
  SC_RETURN_IF_ERROR(AgreeOnCheck(pg, CheckFsdpGroup(fsdp, pg), OpWhat("save_sharded", dir)));
  return SaveImpl(dir, FromFsdp(fsdp), optimizer, pg, extra);
}

absl::StatusOr<std::map<std::string, std::string>> LoadSharded(const std::string& dir,
                                                               FullyShardedModel& fsdp,
                                                               optim::Optimizer& optimizer,
                                                               ProcessGroup& pg,
                                                               const ShardedLoadOptions& options) {
  SC_RETURN_IF_ERROR(AgreeOnCheck(pg, CheckFsdpGroup(fsdp, pg), OpWhat("load_sharded", dir)));
  Participant p = FromFsdp(fsdp);
  return LoadImpl(dir, p, optimizer, pg, options, [&fsdp]() -> absl::Status {
    // Units held unsharded (Unshard, UnshardRoot, or kept from a forward)
    // hold the old values: freed, so the next forward gathers the loaded.
    fsdp.Reshard();
    return absl::OkStatus();
  });
}

absl::Status SaveSharded(const std::string& dir, Zero1& zero, ProcessGroup& pg,
                         const std::map<std::string, std::string>& extra) {
  SC_RETURN_IF_ERROR(AgreeOnCheck(pg, CheckZero1Group(zero, pg), OpWhat("save_sharded", dir)));
  return SaveImpl(dir, FromZero1(zero, pg), zero.optimizer(), pg, extra);
}

absl::StatusOr<std::map<std::string, std::string>> LoadSharded(const std::string& dir, Zero1& zero,
                                                               ProcessGroup& pg,
                                                               const ShardedLoadOptions& options) {
  SC_RETURN_IF_ERROR(AgreeOnCheck(pg, CheckZero1Group(zero, pg), OpWhat("load_sharded", dir)));
  Participant p = FromZero1(zero, pg);
  return LoadImpl(dir, p, zero.optimizer(), pg, options,
                  [&zero]() -> absl::Status {
                    // Every rank's full parameters from the loaded master shards.
                    absl::Status s = zero.RefreshParameters();
                    if (s.ok()) return s;
                    return absl::Status(
                        s.code(), absl::StrCat("all-gather of the master shards: ", s.message()));
                  });
}

absl::StatusOr<ShardedCheckpointInfo> ReadShardedCheckpointInfo(const std::string& dir) {
  absl::StatusOr<Index> x = ReadIndex(StripTrailingSlashes(dir));
  if (!x.ok()) return x.status();
  ShardedCheckpointInfo info;
  info.format_version = x->version;
  info.checkpoint_id = x->id;
  info.writer = x->writer;
  info.strategy = x->strategy;
  info.world_size = x->world_size;
  info.num_files = static_cast<int>(x->files.size());
  info.units = x->units;
  info.optimizer = x->optimizer;
  info.optimizer_buffers = x->buffers;
  info.has_optimizer_state = x->has_state;
  info.optimizer_step = x->has_state ? x->step : -1;
  for (const ParamRec& p : x->params) {
    info.params.emplace_back(p.name, p.shape);
    info.param_has_state.push_back(p.has_state);
  }
  for (const sharded::BufferRec& b : x->model_buffers.tensors) {
    info.buffers.push_back({b.name, b.shape, b.dtype});
  }
  info.extra = x->extra;
  return info;
}

}  // namespace dist
