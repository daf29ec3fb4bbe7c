// Checkpoint inspection and conversion, for the train binaries' checkpoints of
// either kind: single-process / DDP (model.safetensors + optimizer.safetensors)
// and sharded (FSDP or ZeRO-1 at any world size: index.json + shard files).
// Needs no model, no process group and no GPU. verify, consolidate, shard,
// export-hf and diff stream: they hold about one parameter (and its optimizer
// state; diff: one of each side) at a time, so a model larger than host
// memory converts.
//
//   checkpoint info DIR [--params]        what it holds: step, model config, writer,
//                                         strategy, world size, optimizer, parameters,
//                                         module buffers, files
//   checkpoint verify DIR                 reads every tensor: checksums, sizes, shard
//                                         ids, and no NaN or Inf in values or state
//   checkpoint consolidate DIR OUT        a sharded checkpoint as one single-process
//                                         step folder: the fp32 model whole in
//                                         OUT/model.safetensors, the optimizer state
//                                         per parameter; resumes with --strategy=ddp or
//                                         --world_size=1 (as PyTorch's dcp_to_torch_save)
//   checkpoint shard DIR OUT [--buffers=A,B]
//                                         the reverse: a single-process / DDP step folder
//                                         as a sharded one (world size 1) that FSDP and
//                                         ZeRO-1 resume at any world size (torch_save_to_dcp);
//                                         module buffers (BatchNorm's running statistics)
//                                         as a consolidated folder records them, else
//                                         those --buffers names
//   checkpoint export-hf DIR OUT          a minGPT checkpoint (either kind) as a Hugging
//                                         Face GPT-2 folder: OUT/config.json and
//                                         OUT/model.safetensors in GPT2LMHeadModel's
//                                         names and layout (transformers loads it; the
//                                         train and sample binaries read such folders
//                                         back, see models/mingpt/pretrained.h);
//                                         with the checkpoint's tokenizer (train records
//                                         it) or --tokenizer=gpt2|DIR, OUT/vocab.json and
//                                         OUT/merges.txt too, which sample then uses
//                                         (--tokenizer=none: without); a T5 checkpoint
//                                         as a T5ForConditionalGeneration folder
//                                         (models/t5/pretrained.h), with the
//                                         SentencePiece model its data was encoded
//                                         with (train records it) or
//                                         --tokenizer=FILE|DIR: OUT/spiece.model and
//                                         OUT/tokenizer_config.json
//   checkpoint diff DIR_A DIR_B [--atol=X --rtol=Y]
//                                         the models parameter by parameter (largest
//                                         differences first); exit 1 unless every
//                                         |a - b| <= atol + rtol |b| (default: equal)
//
// DIR is a step folder, or a checkpoint directory with a `latest` file (its
// newest step). Exit status: 0 done; 1 a check failed (verify: anything wrong
// with the checkpoint, a missing or corrupted file included; diff: the models
// differ); 2 bad arguments, or a checkpoint the other commands cannot read
// (the message names the file and what was wrong).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "dist/sharded_checkpoint_offline.h"
#include "models/common/checkpoint_convert.h"
#include "models/common/checkpoint_dir.h"
#include "models/common/command_line.h"
#include "models/common/train_support.h"
#include "models/data/gpt2_tokenizer.h"
#include "models/data/runfiles.h"
#include "models/mingpt/pretrained.h"
#include "models/t5/config.h"
#include "models/t5/pretrained.h"
#include "models/t5/spiece_files.h"
#include "nn/state_dict.h"
#include "tensor/durable_file.h"
#include "tensor/error.h"
#include "tensor/read_file.h"
#include "tensor/safetensors.h"

ABSL_FLAG(bool, params, false, "info: list every parameter (name, shape, elements)");
ABSL_FLAG(std::string, buffers, "",
          "shard: the entries of model.safetensors that are module buffers (BatchNorm's "
          "running_mean, running_var, num_batches_tracked; comma-separated), when it does not "
          "record them");
ABSL_FLAG(double, atol, 0.0, "diff: absolute tolerance");
ABSL_FLAG(double, rtol, 0.0, "diff: tolerance relative to DIR_B's value");
ABSL_FLAG(int, top, 10, "diff: parameters listed (largest differences first); 0: all");
ABSL_FLAG(std::string, tokenizer, "auto",
          "export-hf: also write this tokenizer to OUT: auto (the one the checkpoint records, "
          "if any), none, or for minGPT (vocab.json + merges.txt) gpt2 (the repository's copy "
          "of GPT-2's) or a folder, for T5 (spiece.model + tokenizer_config.json) a "
          "spiece.model or a folder holding one");

namespace {

constexpr char kUsage[] =
    "checkpoint info DIR [--params] | verify DIR | consolidate DIR OUT | "
    "shard DIR OUT [--buffers=A,B] | "
    "export-hf DIR OUT [--tokenizer=auto|none|gpt2|DIR|FILE] | "
    "diff DIR_A DIR_B [--atol=X] [--rtol=Y] [--top=N]";

int Fail(const std::string& message) {
  std::fprintf(stderr, "checkpoint: error: %s\n", message.c_str());
  return 2;
}

std::string Human(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30)) return absl::StrFormat("%.2f GiB", bytes / 1073741824.0);
  if (bytes >= (int64_t{1} << 20)) return absl::StrFormat("%.2f MiB", bytes / 1048576.0);
  return absl::StrFormat("%.1f KiB", bytes / 1024.0);
}

int Info(const std::string& dir) {
  absl::StatusOr<train::CheckpointSummary> s = train::ReadCheckpointSummary(dir);
  if (!s.ok()) return Fail(std::string(s.status().message()));
  std::printf("checkpoint %s\n", dir.c_str());
  if (s->sharded && s->writer == "converted") {
    std::printf(
        "  kind:        sharded, converted from a single-process checkpoint "
        "(`checkpoint shard`), world size 1\n");
  } else if (s->sharded) {
    std::printf("  kind:        sharded, written by %s (%s) at world size %d\n", s->writer.c_str(),
                s->strategy.c_str(), s->world_size);
    if (s->writer == "fsdp") std::printf("  FSDP units:  %zu\n", s->units.size());
  } else {
    std::printf("  kind:        single-process (one process, or DDP's rank 0)\n");
  }
  std::printf("  step:        %lld\n", static_cast<long long>(s->state.step));
  for (const auto& [k, v] : s->state.extra)
    std::printf("  %-12s %s\n", (k + ":").c_str(), v.c_str());
  if (!s->state.loader_state.empty()) {
    std::printf("  loader:      %s\n", s->state.loader_state.c_str());
  }
  int64_t elements = 0;
  for (const auto& [name, shape] : s->params) elements += shape.numel();
  std::printf("  parameters:  %zu tensors, %lld elements (%s in fp32)\n", s->params.size(),
              static_cast<long long>(elements), Human(elements * 4).c_str());
  if (s->has_optimizer_state) {
    std::printf("  optimizer:   %s (%s), step %s\n", s->optimizer.c_str(),
                absl::StrJoin(s->optimizer_buffers, ", ").c_str(),
                s->optimizer_step >= 0 ? absl::StrCat(s->optimizer_step).c_str()
                                       : "differs between parameters");
  } else if (s->model_only) {
    std::printf("  optimizer:   none: no optimizer.safetensors (the model kept alone, or a copy "
                "cut short: it samples, exports and starts a run with --init_from, but does not "
                "resume)\n");
  } else {
    std::printf("  optimizer:   %s, no state (saved before the first step)\n",
                s->optimizer.empty() ? "unknown" : s->optimizer.c_str());
  }
  if (!s->buffers.empty()) {
    int64_t buffer_elements = 0;
    for (const train::CheckpointSummary::Buffer& b : s->buffers) buffer_elements += b.shape.numel();
    std::printf("  buffers:     %zu tensors, %lld elements\n", s->buffers.size(),
                static_cast<long long>(buffer_elements));
  }
  int64_t bytes = 0;
  for (const auto& [name, n] : s->files) bytes += n;
  std::printf("  files:       %zu, %s\n", s->files.size(), Human(bytes).c_str());
  for (const auto& [name, n] : s->files) {
    std::printf("    %-36s %s\n", name.c_str(), Human(n).c_str());
  }
  if (absl::GetFlag(FLAGS_params)) {
    for (const auto& [name, shape] : s->params) {
      std::printf("    %-48s %-16s %lld\n", name.c_str(), shape.ToString().c_str(),
                  static_cast<long long>(shape.numel()));
    }
    for (const train::CheckpointSummary::Buffer& b : s->buffers) {
      std::printf("    %-48s %-16s %lld (buffer, %s)\n", b.name.c_str(), b.shape.ToString().c_str(),
                  static_cast<long long>(b.shape.numel()),
                  std::string(tensor::DtypeName(b.dtype)).c_str());
    }
  }
  return 0;
}

// Elements of an f32 tensor that are NaN or infinite.
int64_t NonFinite(const tensor::Tensor& t) {
  const tensor::Tensor c = t.Contiguous();
  const float* d = c.data<float>();
  int64_t n = 0;
  for (int64_t i = 0; i < c.numel(); ++i) n += std::isfinite(d[i]) ? 0 : 1;
  return n;
}

int Verify(const std::string& dir) {
  bool model_only = false;
  std::vector<std::string> problems;
  int64_t tensors = 0, elements = 0;
  auto check = [&](const std::string& what, const tensor::Tensor& t) {
    ++tensors;
    elements += t.numel();
    if (t.dtype() != tensor::Dtype::kF32) return;
    const int64_t bad = NonFinite(t);
    if (bad > 0) problems.push_back(absl::StrCat(what, " has ", bad, " NaN or infinite values"));
  };
  if (train::IsShardedCheckpoint(dir)) {
    absl::StatusOr<train::CheckpointSummary> s = train::ReadCheckpointSummary(dir);
    if (!s.ok()) return Fail(std::string(s.status().message()));
    absl::Status read = dist::ForEachWholeParameter(dir, true, [&](const dist::WholeParameter& p) {
      check(absl::StrCat("parameter '", p.name, "'"), p.value);
      for (size_t k = 0; k < p.buffers.size(); ++k) {
        check(absl::StrCat("optimizer ", s->optimizer_buffers[k], " of '", p.name, "'"),
              p.buffers[k]);
      }
      return absl::OkStatus();
    });
    absl::StatusOr<tensor::NamedTensors> buffers = dist::ReadShardedBuffers(dir);
    if (read.ok() && !buffers.ok()) read = buffers.status();
    if (!read.ok()) {
      std::printf("FAILED %s: %s\n", dir.c_str(), std::string(read.message()).c_str());
      return 1;
    }
    for (const auto& [name, t] : *buffers) check(absl::StrCat("buffer '", name, "'"), t);
  } else {
    // The checksum over each file in pieces, then one tensor at a time.
    std::map<std::string, std::map<std::string, std::string>> metadata;  // of each file
    model_only = train::IsModelOnly(dir);
    for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
      if (model_only && file == std::string("optimizer.safetensors")) continue;
      const std::string path = dir + "/" + file;
      absl::StatusOr<tensor::SafetensorsHeader> h = tensor::ReadVerifiedSafetensorsHeader(path);
      absl::Status read = h.status();
      if (read.ok()) metadata[file] = h->metadata;
      for (size_t i = 0; read.ok() && i < h->entries.size(); ++i) {
        const tensor::SafetensorsEntry& e = h->entries[i];
        absl::StatusOr<tensor::Tensor> t = tensor::ReadSafetensorsEntry(path, *h, e);
        read = t.status();
        if (read.ok()) check(absl::StrCat(file, " '", e.name, "'"), *t);
      }
      if (!read.ok()) {
        std::printf("FAILED %s: %s\n", dir.c_str(), std::string(read.message()).c_str());
        return 1;
      }
    }
    absl::StatusOr<train::CheckpointSummary> s = train::ReadCheckpointSummary(dir);
    if (!s.ok()) problems.push_back(std::string(s.status().message()));
    if (!model_only) {
      absl::Status same = train::CheckSameSave(dir, metadata["model.safetensors"],
                                               metadata["optimizer.safetensors"]);
      if (!same.ok()) problems.push_back(std::string(same.message()));
    }
  }
  if (!problems.empty()) {
    std::printf("FAILED %s: %zu problem(s)\n", dir.c_str(), problems.size());
    for (const std::string& p : problems) std::printf("  %s\n", p.c_str());
    return 1;
  }
  std::printf(
      "OK %s: %lld tensors, %lld elements read; every stored checksum matches; no NaN or Inf%s\n",
      dir.c_str(), static_cast<long long>(tensors), static_cast<long long>(elements),
      model_only ? "; the model alone (no optimizer.safetensors: removed on purpose, or a copy cut "
                   "short): it does not resume"
                 : "");
  return 0;
}

int Consolidate(const std::string& dir, const std::string& out) {
  absl::Status s = train::ConsolidateShardedCheckpoint(dir, out);
  if (!s.ok()) return Fail(std::string(s.message()));
  std::string folder = out;  // "OUT/" named as OUT
  while (folder.size() > 1 && folder.back() == '/') folder.pop_back();
  std::printf("wrote %s/model.safetensors and optimizer.safetensors from %s\n", folder.c_str(),
              dir.c_str());
  return 0;
}

int Shard(const std::string& dir, const std::string& out) {
  absl::StatusOr<std::vector<std::string>> buffers =
      train::SplitListFlag("buffers", absl::GetFlag(FLAGS_buffers));
  if (!buffers.ok()) return Fail(std::string(buffers.status().message()));
  absl::Status s = train::ShardSingleProcessCheckpoint(dir, out, *buffers);
  if (!s.ok()) return Fail(std::string(s.message()));
  std::printf("wrote the sharded checkpoint %s (world size 1) from %s\n", out.c_str(), dir.c_str());
  return 0;
}

// What an export wrote: the model ("GPT-2", "T5") and its files, configuration
// and source, said once the folder is in place.
struct Exported {
  std::string model;
  std::string contents;
};

// A T5 checkpoint as a Hugging Face T5ForConditionalGeneration folder in
// `tmp`, with its SentencePiece tokenizer (spiece.model, and a
// tokenizer_config.json giving the sentinels) when the checkpoint records one
// (//models/t5:train records what tools/spm_tokenize.py wrote beside a .bin
// --data) or --tokenizer names a spiece.model or a folder holding one. The
// tokenizer is checked before anything is written: its pieces must be the
// ids of the data the checkpoint was trained on (its loader state says how
// many), and they and the sentinels must fit the model's vocabulary.
absl::StatusOr<Exported> ExportHfT5(const train::RecordedCheckpoint& recorded,
                                       const t5::T5Config& config, const std::string& tmp) {
  const std::string flag = absl::GetFlag(FLAGS_tokenizer);
  // auto: a SentencePiece model the checkpoint records (data of another
  // tokenizer, or bytes, exports without).
  std::string spec = flag == "auto" ? recorded.tokenizer : flag == "none" ? "" : flag;
  if (flag == "auto" && !absl::StartsWith(spec, "sentencepiece:")) spec.clear();
  std::optional<t5::SentencePieceModel> spiece;
  int64_t sentinels = 0;  // above the tokenizer's pieces (SentinelsOfTokenizer)
  if (flag == "gpt2") {
    return absl::InvalidArgumentError(
        "--tokenizer=gpt2: GPT-2's BPE is minGPT's; a T5 checkpoint takes a spiece.model or a "
        "folder holding one");
  }
  if (!spec.empty()) {
    const std::string what =
        flag == "auto" ? absl::StrCat("the tokenizer the checkpoint records (", spec,
                                      "; --tokenizer=FILE|DIR names where it is now, "
                                      "--tokenizer=none exports without it)")
                       : absl::StrCat("--tokenizer=", flag);
    absl::StatusOr<t5::TokenizerOfWeights> read = t5::ReadTokenizerOfWeights(
        spec, what, recorded.loader_state, recorded.description, config.vocab_size);
    if (!read.ok()) return read.status();
    spiece = std::move(read->model);
    sentinels = read->sentinels;
  }
  // The special ids config.json records: the tokenizer names their pieces.
  const t5::HfT5Ids ids = t5::HfT5IdsOfLoaderState(recorded.loader_state);
  absl::StatusOr<nn::NamedInitSources> sources = train::OpenCheckpointModel(recorded.step_dir);
  if (!sources.ok()) return sources.status();
  // The special ids the run's batches used (a checkpoint without a span
  // corruption loader's state: T5's own).
  absl::Status s = t5::WriteHfT5(tmp, config, *sources, ids);
  if (!s.ok()) return s;
  std::string written = "config.json, model.safetensors";
  if (spiece) {
    // Written durably, as the weights are: the folder is renamed in next.
    s = tensor::WriteFileDurably(tmp + "/spiece.model", spiece->bytes);
    if (s.ok()) {
      s = tensor::WriteFileDurably(
          tmp + "/tokenizer_config.json",
          t5::T5TokenizerConfigJson(spiece->pieces, sentinels, ids.pad_id, ids.eos_id));
    }
    if (!s.ok()) return s;
    absl::StrAppend(&written, ", spiece.model (", spiece->pieces.texts.size(), " pieces, from ",
                    spiece->path, "), tokenizer_config.json (", sentinels, " sentinels)");
  }
  return Exported{"T5", absl::StrCat("(", written, ") of ", config.ToString(), " from ",
                                     recorded.description)};
}

// The export of checkpoint `dir` into the temporary folder `tmp`: a T5
// checkpoint by its recorded configuration; else minGPT's (whose errors say
// what the folder is not).
absl::StatusOr<Exported> ExportHfInto(const std::string& dir, const std::string& tmp) {
  if (absl::StatusOr<train::RecordedCheckpoint> recorded = train::ReadRecordedCheckpoint(dir);
      recorded.ok()) {
    if (absl::StatusOr<t5::T5Config> config = t5::ParseConfig(recorded->config); config.ok()) {
      return ExportHfT5(*recorded, *config, tmp);
    }
  }
  // Opened, not read: the weights are read and written one at a time.
  absl::StatusOr<mingpt::PretrainedSources> w = mingpt::OpenPretrained(dir);
  if (!w.ok()) return w.status();
  // The tokenizer is checked before anything is written.
  const std::string flag = absl::GetFlag(FLAGS_tokenizer);
  // auto: the one the checkpoint records (train's), if any.
  const std::string tokenizer_flag = flag == "auto" ? w->tokenizer : flag == "none" ? "" : flag;
  std::pair<std::string, std::string> tokenizer_files;
  std::optional<int64_t> end_of_text;  // config.json's bos/eos ids: the tokenizer's
  if (!tokenizer_flag.empty()) {
    absl::StatusOr<data::Gpt2Tokenizer> tokenizer =
        data::Gpt2Tokenizer::OpenForModel(tokenizer_flag, w->config.vocab_size);
    if (!tokenizer.ok()) {
      return absl::Status(
          tokenizer.status().code(),
          absl::StrCat(flag == "auto"
                           ? absl::StrCat("the tokenizer the checkpoint records (", tokenizer_flag,
                                          "; --tokenizer=none exports without it)")
                           : absl::StrCat("--tokenizer=", tokenizer_flag),
                       ": ", tokenizer.status().message()));
    }
    tokenizer_files = *data::Gpt2Tokenizer::FindFiles(tokenizer->source());
    end_of_text = tokenizer->end_of_text();
  }
  absl::Status s = mingpt::WriteHfGpt2(tmp, w->config, w->sources, end_of_text);
  if (!s.ok()) return s;
  std::string written = "config.json, model.safetensors";
  if (!tokenizer_flag.empty()) {
    // Copied durably, as the weights are written: the folder is renamed in next.
    for (const auto& [from, name] : {std::pair{tokenizer_files.first, "vocab.json"},
                                     std::pair{tokenizer_files.second, "merges.txt"}}) {
      absl::StatusOr<std::string> bytes = tensor::ReadFile(from);
      if (!bytes.ok()) {
        return absl::UnavailableError(absl::StrCat(bytes.status().message(), " (for ", name, ")"));
      }
      absl::Status s = tensor::WriteFileDurably(tmp + "/" + name, *bytes);
      if (!s.ok()) return s;
    }
    absl::StrAppend(&written, ", vocab.json, merges.txt");
  }
  return Exported{"GPT-2", absl::StrCat("(", written, ") of ", w->config.ToString(), " from ",
                                        w->source)};
}

// Written whole or not at all (train::WriteFreshFolder): not over, or mixed
// with, another folder's files, and a failed or interrupted export leaves
// nothing at OUT (into a link or a mount point: written in place, emptied
// when it fails), so that it can be run again as it was.
int ExportHf(const std::string& dir, const std::string& out) {
  Exported exported;
  absl::Status s = train::WriteFreshFolder(out, "export-hf", [&](const std::string& tmp) {
    absl::StatusOr<Exported> written = ExportHfInto(dir, tmp);
    if (!written.ok()) return written.status();
    exported = *std::move(written);
    return absl::OkStatus();
  });
  if (!s.ok()) return Fail(std::string(s.message()));
  std::printf("wrote the Hugging Face %s folder %s %s\n", exported.model.c_str(), out.c_str(),
              exported.contents.c_str());
  return 0;
}

// One side of a diff: every stored parameter's name, shape and dtype, each
// read whole only when asked (a single-process folder's checksum is verified
// when it is opened, in pieces; a sharded one's blocks as they are read).
class StoredModel {
 public:
  static absl::StatusOr<StoredModel> Open(const std::string& dir) {
    StoredModel m;
    if (train::IsShardedCheckpoint(dir)) {
      absl::StatusOr<nn::NamedInitSources> sources = dist::ShardedCheckpointInitSources(dir);
      if (!sources.ok()) return sources.status();
      absl::StatusOr<train::CheckpointSummary> summary = train::ReadCheckpointSummary(dir);
      if (!summary.ok()) return summary.status();
      std::map<std::string, tensor::Dtype> buffer_dtypes;  // parameters are f32
      for (const auto& b : summary->buffers) buffer_dtypes[b.name] = b.dtype;
      for (const auto& [name, source] : *sources) {
        auto buffer = buffer_dtypes.find(name);
        m.entries_.push_back({name, buffer == buffer_dtypes.end() ? tensor::Dtype::kF32
                                                                  : buffer->second,
                              source->shape()});
        m.sources_[name] = source;
      }
      return m;
    }
    m.path_ = dir + "/model.safetensors";
    absl::StatusOr<tensor::SafetensorsHeader> header =
        tensor::ReadVerifiedSafetensorsHeader(m.path_);
    if (!header.ok()) return header.status();
    m.entries_ = header->entries;
    m.header_ = std::make_shared<tensor::SafetensorsHeader>(*std::move(header));
    return m;
  }
  const std::vector<tensor::SafetensorsEntry>& entries() const { return entries_; }
  absl::StatusOr<tensor::Tensor> Read(const tensor::SafetensorsEntry& e) const {
    if (header_ != nullptr) return tensor::ReadSafetensorsEntry(path_, *header_, e);
    tensor::Tensor t = tensor::Tensor::Empty(e.shape, e.dtype);
    try {
      sources_.at(e.name)->Read(0, t);
    } catch (const tensor::OpError& error) {
      return absl::DataLossError(error.what());
    }
    return t;
  }

 private:
  std::vector<tensor::SafetensorsEntry> entries_;  // name, shape, dtype (offsets unused)
  std::string path_;                               // single-process: model.safetensors
  std::shared_ptr<const tensor::SafetensorsHeader> header_;
  std::map<std::string, std::shared_ptr<const nn::InitSource>> sources_;  // sharded
};

struct ParamDiff {
  std::string name;
  double max_abs = 0;
  double max_rel = 0;  // |a - b| / |b| where b != 0
  int64_t over = 0;    // elements beyond atol + rtol |b|
  int64_t numel = 0;
};

int Diff(const std::string& dir_a, const std::string& dir_b) {
  // Parameter by parameter: two are held at a time, not the two models.
  absl::StatusOr<StoredModel> a = StoredModel::Open(dir_a);
  if (!a.ok()) return Fail(std::string(a.status().message()));
  absl::StatusOr<StoredModel> b = StoredModel::Open(dir_b);
  if (!b.ok()) return Fail(std::string(b.status().message()));
  const double atol = absl::GetFlag(FLAGS_atol), rtol = absl::GetFlag(FLAGS_rtol);
  std::map<std::string, const tensor::SafetensorsEntry*> by_name;
  for (const tensor::SafetensorsEntry& e : b->entries()) by_name[e.name] = &e;
  std::vector<std::string> mismatched;
  std::vector<ParamDiff> diffs;
  for (const tensor::SafetensorsEntry& ea : a->entries()) {
    const std::string& name = ea.name;
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      mismatched.push_back(absl::StrCat("'", name, "' is only in ", dir_a));
      continue;
    }
    const tensor::SafetensorsEntry& eb = *it->second;
    if (ea.shape != eb.shape || ea.dtype != eb.dtype) {
      mismatched.push_back(absl::StrCat(
          "'", name, "' is ", ea.shape.ToString(), " ", tensor::DtypeName(ea.dtype), " in A but ",
          eb.shape.ToString(), " ", tensor::DtypeName(eb.dtype), " in B"));
      by_name.erase(it);
      continue;
    }
    absl::StatusOr<tensor::Tensor> ta = a->Read(ea);
    if (!ta.ok()) return Fail(std::string(ta.status().message()));
    absl::StatusOr<tensor::Tensor> tb = b->Read(eb);
    if (!tb.ok()) return Fail(std::string(tb.status().message()));
    const tensor::Tensor ca = ta->To(tensor::Dtype::kF32).Contiguous();
    const tensor::Tensor cb = tb->To(tensor::Dtype::kF32).Contiguous();
    const float* pa = ca.data<float>();
    const float* pb = cb.data<float>();
    ParamDiff d;
    d.name = name;
    d.numel = ca.numel();
    for (int64_t i = 0; i < d.numel; ++i) {
      const double x = pa[i], y = pb[i];
      const bool same = x == y || (std::isnan(x) && std::isnan(y));
      const double e = same ? 0.0 : std::abs(x - y);  // NaN against a number: NaN
      if (!(e <= atol + rtol * std::abs(y))) ++d.over;
      if (std::isnan(e)) {
        d.max_abs = e;  // stays NaN
      } else if (!std::isnan(d.max_abs) && e > d.max_abs) {
        d.max_abs = e;
      }
      if (y != 0 && e / std::abs(y) > d.max_rel) d.max_rel = e / std::abs(y);
    }
    diffs.push_back(d);
    by_name.erase(it);
  }
  for (const auto& [name, t] : by_name) {
    mismatched.push_back(absl::StrCat("'", name, "' is only in ", dir_b));
  }
  std::stable_sort(diffs.begin(), diffs.end(), [](const ParamDiff& x, const ParamDiff& y) {
    return std::isnan(x.max_abs) ? !std::isnan(y.max_abs) : x.max_abs > y.max_abs;
  });
  int64_t over = 0, elements = 0, differing = 0;
  double max_abs = 0;
  for (const ParamDiff& d : diffs) {
    over += d.over;
    elements += d.numel;
    differing += d.max_abs != 0 ? 1 : 0;
    if (std::isnan(d.max_abs) || d.max_abs > max_abs) max_abs = d.max_abs;
  }
  std::printf("A: %s\nB: %s\n", dir_a.c_str(), dir_b.c_str());
  const int top = absl::GetFlag(FLAGS_top);  // checked >= 0 in main
  const size_t shown = top <= 0 ? diffs.size() : std::min<size_t>(diffs.size(), top);
  if (shown > 0) {
    std::printf("  %-48s %12s %12s %10s\n", "parameter", "max |a-b|", "max rel", "over tol");
    for (size_t i = 0; i < shown; ++i) {
      const ParamDiff& d = diffs[i];
      std::printf("  %-48s %12.4g %12.4g %10lld\n", d.name.c_str(), d.max_abs, d.max_rel,
                  static_cast<long long>(d.over));
    }
    if (shown < diffs.size()) std::printf("  ... %zu more\n", diffs.size() - shown);
  }
  const size_t shown_mismatches =
      top <= 0 ? mismatched.size() : std::min<size_t>(mismatched.size(), top);
  for (size_t i = 0; i < shown_mismatches; ++i) {
    std::printf("  MISMATCH %s\n", mismatched[i].c_str());
  }
  if (shown_mismatches < mismatched.size()) {
    std::printf("  ... %zu more mismatches\n", mismatched.size() - shown_mismatches);
  }
  if (diffs.empty() && !mismatched.empty()) {
    std::printf("no parameter of the same name and shape in both: models of another "
                "architecture or size\n");
  }
  const bool ok = mismatched.empty() && over == 0;
  std::printf(
      "%s: %zu parameters compared (%lld elements), %lld differ, largest |a-b| %.4g; "
      "%lld elements beyond atol %g + rtol %g |b|%s\n",
      ok ? "SAME" : "DIFFERENT", diffs.size(), static_cast<long long>(elements),
      static_cast<long long>(differing), max_abs, static_cast<long long>(over), atol, rtol,
      mismatched.empty() ? ""
                         : absl::StrCat("; ", mismatched.size(), " name/shape mismatches").c_str());
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> a = train::ParseCommandLineOrExit(argc, argv, kUsage, 3);
  data::SetProgramPath(argv[0]);
  if (a.empty()) return Fail(absl::StrCat("no command; usage: ", kUsage));
  const std::string& cmd = a[0];
  if (absl::GetFlag(FLAGS_top) < 0) {
    return Fail(absl::StrCat("--top=", absl::GetFlag(FLAGS_top), " must be >= 0 (0: all)"));
  }
  for (const auto& [name, value] : {std::pair<const char*, double>{"atol", absl::GetFlag(FLAGS_atol)},
                                    {"rtol", absl::GetFlag(FLAGS_rtol)}}) {
    // diff's: a NaN, negative or infinite tolerance decides nothing.
    if (cmd == "diff" && (!(value >= 0) || !std::isfinite(value))) {
      return Fail(absl::StrCat("--", name, "=", value, " must be finite and >= 0"));
    }
  }
  const std::map<std::string, size_t> arguments = {{"info", 1},  {"verify", 1},
                                                    {"consolidate", 2}, {"shard", 2},
                                                    {"export-hf", 2}, {"diff", 2}};
  const auto known = arguments.find(cmd);
  if (known != arguments.end() && a.size() != known->second + 1) {
    return Fail(absl::StrCat("wrong number of arguments for '", cmd, "'; usage: ", kUsage));
  }
  // The step folders a command reads (not export-hf's, a checkpoint or a
  // Hugging Face folder); verify reports one it cannot find as FAILED (exit 1).
  std::vector<std::string> folders;
  const size_t inputs = known == arguments.end() || cmd == "export-hf" ? 0
                        : cmd == "diff"                                  ? 2
                                                                         : 1;
  for (size_t i = 1; i <= inputs; ++i) {
    absl::StatusOr<std::string> folder = train::StepFolderOf(a[i]);
    if (!folder.ok() && cmd == "verify") {
      std::printf("FAILED %s: %s\n", a[i].c_str(), std::string(folder.status().message()).c_str());
      return 1;
    }
    if (!folder.ok()) return Fail(std::string(folder.status().message()));
    folders.push_back(*folder);
  }
  if (cmd == "info") return Info(folders[0]);
  if (cmd == "verify") return Verify(folders[0]);
  if (cmd == "consolidate") return Consolidate(folders[0], a[2]);
  if (cmd == "shard") return Shard(folders[0], a[2]);
  if (cmd == "export-hf") return ExportHf(a[1], a[2]);
  if (cmd == "diff") return Diff(folders[0], folders[1]);
  return Fail(absl::StrCat("unknown command '", cmd,
                           "' (info, verify, consolidate, shard, export-hf or diff); usage: ",
                           kUsage));
}
