// Consolidating a sharded checkpoint streams it: the single-process files
// hold every parameter and its optimizer state as saved, and the host holds
// one parameter (and its state) at a time, not the model. A new folder is
// written whole or not at all (WriteFreshFolder).
#include "models/common/checkpoint_convert.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "dist/sharded_checkpoint_offline.h"
#include "gtest/gtest.h"
#include "models/common/train_support.h"
#include "tensor/memory_ledger.h"
#include "tensor/safetensors.h"
#include "tensor/testing.h"

namespace train {
namespace {

using tensor::Tensor;

// Module buffers (BatchNorm's running statistics) survive both ways:
// consolidated, model.safetensors holds them after the parameters in their
// dtypes (as nn::StateDict orders them) and names them in its metadata;
// sharded again, the sharded checkpoint holds them as its buffers. A
// single-process folder that does not name them is sharded with the names
// given, and refused without them when a buffer is not fp32.
TEST(ConsolidateTest, ModuleBuffersSurviveConsolidateAndShard) {
  const std::string root = ::testing::TempDir() + "/consolidate_buffers";
  std::filesystem::remove_all(root);
  const std::string sharded = root + "/sharded", out = root + "/single";
  std::vector<dist::WholeParameter> params(2);
  params[0].name = "0.weight";
  params[0].value = tensor::testing::RandomTensor({4, 3}, 1);
  params[1].name = "1.weight";
  params[1].value = tensor::testing::RandomTensor({4}, 2);
  const tensor::NamedTensors buffers = {
      {"1.running_mean", tensor::testing::RandomTensor({4}, 3)},
      {"1.running_var", tensor::testing::RandomTensor({4}, 4, 0.5, 2)},
      {"1.num_batches_tracked", Tensor::FromData<int64_t>({7}, {})}};
  TrainState state;
  state.step = 7;
  ASSERT_TRUE(dist::WriteWholeParameters(sharded, params, "sgd", {"momentum_buffer"},
                                         ShardedCheckpointExtra(state), buffers)
                  .ok());
  absl::StatusOr<CheckpointSummary> summary = ReadCheckpointSummary(sharded);
  ASSERT_TRUE(summary.ok()) << summary.status();
  ASSERT_EQ(summary->buffers.size(), 3u);
  EXPECT_EQ(summary->buffers[2].name, "1.num_batches_tracked");
  EXPECT_EQ(summary->buffers[2].dtype, tensor::Dtype::kI64);

  absl::Status s = ConsolidateShardedCheckpoint(sharded, out);
  ASSERT_TRUE(s.ok()) << s;
  auto model = tensor::ReadSafetensors(out + "/model.safetensors");
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ(model->tensors.size(), 5u);
  EXPECT_EQ(model->tensors[1].first, "1.weight");
  for (size_t i = 0; i < buffers.size(); ++i) {
    EXPECT_EQ(model->tensors[2 + i].first, buffers[i].first);
    EXPECT_EQ(model->tensors[2 + i].second.dtype(), buffers[i].second.dtype());
    EXPECT_TRUE(tensor::testing::AllClose(model->tensors[2 + i].second, buffers[i].second, 0, 0))
        << buffers[i].first;
  }
  EXPECT_EQ(model->header.metadata.at(kBufferNamesKey),
            "1.running_mean,1.running_var,1.num_batches_tracked");
  summary = ReadCheckpointSummary(out);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->params.size(), 2u);
  EXPECT_EQ(summary->buffers.size(), 3u);

  const std::string again = root + "/sharded_again";
  s = ShardSingleProcessCheckpoint(out, again);
  ASSERT_TRUE(s.ok()) << s;
  absl::StatusOr<tensor::NamedTensors> back = dist::ReadShardedBuffers(again);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    EXPECT_EQ((*back)[i].first, buffers[i].first);
    EXPECT_EQ((*back)[i].second.dtype(), buffers[i].second.dtype());
    EXPECT_TRUE(tensor::testing::AllClose((*back)[i].second, buffers[i].second, 0, 0));
  }
  absl::StatusOr<tensor::NamedTensors> whole = ReadCheckpointModel(again);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->size(), 5u);

  // A single-process folder as WriteCheckpointFiles writes it (nn::StateDict:
  // parameters then buffers, not named): refused without the buffers' names,
  // sharded with them.
  const std::string plain = root + "/plain";
  std::filesystem::create_directories(plain);
  tensor::NamedTensors entries = {{params[0].name, params[0].value},
                                  {params[1].name, params[1].value}};
  entries.insert(entries.end(), buffers.begin(), buffers.end());
  ASSERT_TRUE(WriteCheckpointFiles(plain, entries, {}, "sgd", state).ok());
  s = ShardSingleProcessCheckpoint(plain, root + "/plain_sharded");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "'1.num_batches_tracked' is i64")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "--buffers=")) << s;
  s = ShardSingleProcessCheckpoint(plain, root + "/plain_sharded",
                                   {"1.running_mean", "1.running_var", "1.num_batches_tracked"});
  ASSERT_TRUE(s.ok()) << s;
  back = dist::ReadShardedBuffers(root + "/plain_sharded");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->size(), 3u);
  s = ShardSingleProcessCheckpoint(plain, root + "/plain_sharded2", {"1.nope"});
  EXPECT_TRUE(absl::StrContains(s.message(), "has no entry '1.nope'")) << s;
  // The train binaries' saves (WriteCheckpointStep) name their buffers: no
  // names needed.
  const std::string named = root + "/named";
  std::filesystem::create_directories(named);
  ASSERT_TRUE(WriteCheckpointFiles(named, entries, {}, "sgd", state,
                                   {"1.running_mean", "1.running_var", "1.num_batches_tracked"})
                  .ok());
  s = ShardSingleProcessCheckpoint(named, root + "/named_sharded");
  ASSERT_TRUE(s.ok()) << s;
  back = dist::ReadShardedBuffers(root + "/named_sharded");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->size(), 3u);
  // --buffers that disagree with the names the file records: refused.
  s = ShardSingleProcessCheckpoint(named, root + "/named_sharded2", {"1.running_mean"});
  EXPECT_TRUE(absl::StrContains(s.message(), "--buffers=1.running_mean differs from the buffers"))
      << s;
}

TEST(ConsolidateTest, StreamsOneParameterAtATimeAndKeepsEveryValue) {
  const std::string root = ::testing::TempDir() + "/consolidate";
  std::filesystem::remove_all(root);
  const std::string sharded = root + "/sharded", out = root + "/single";
  // Eight parameters of 64 Ki floats; "p3" was never stepped (no state).
  std::vector<dist::WholeParameter> params;
  for (int i = 0; i < 8; ++i) {
    dist::WholeParameter p;
    p.name = "p" + std::to_string(i);
    p.value = tensor::testing::RandomTensor({256, 256}, 10 + i);
    if (i != 3) {
      p.has_state = true;
      p.step = 5;
      p.buffers = {tensor::testing::RandomTensor({256, 256}, 100 + i),
                   tensor::testing::RandomTensor({256, 256}, 200 + i, 0, 1)};
    }
    params.push_back(p);
  }
  TrainState state;
  state.step = 5;
  state.loader_state = "loader";
  ASSERT_TRUE(dist::WriteWholeParameters(sharded, params, "adamw", {"exp_avg", "exp_avg_sq"},
                                         ShardedCheckpointExtra(state))
                  .ok());

  tensor::MemoryLedger& ledger = tensor::MemoryLedger::Process();
  const int64_t before = ledger.Total(tensor::Device::Cpu()).current;
  ledger.ResetPeaks();
  absl::Status s = ConsolidateShardedCheckpoint(sharded, out);
  ASSERT_TRUE(s.ok()) << s;
  const int64_t held = ledger.Total(tensor::Device::Cpu()).peak - before;
  const int64_t param_bytes = 256 * 256 * 4;
  // One parameter, its two buffers and a host copy being written (the whole
  // checkpoint is 8 + 7 x 2 = 22 such tensors).
  EXPECT_LE(held, 4 * param_bytes + 4096) << "bytes of tensors held at once";

  auto model = tensor::ReadSafetensors(out + "/model.safetensors");
  ASSERT_TRUE(model.ok()) << model.status();
  auto opt = tensor::ReadSafetensors(out + "/optimizer.safetensors");
  ASSERT_TRUE(opt.ok()) << opt.status();
  EXPECT_EQ(opt->header.metadata.at("optimizer"), "adamw");
  std::map<std::string, Tensor> saved(opt->tensors.begin(), opt->tensors.end());
  ASSERT_EQ(model->tensors.size(), params.size());
  EXPECT_EQ(saved.size(), 7u * 3);
  for (size_t i = 0; i < params.size(); ++i) {
    const dist::WholeParameter& p = params[i];
    EXPECT_EQ(model->tensors[i].first, p.name);
    EXPECT_TRUE(tensor::testing::AllClose(model->tensors[i].second, p.value, 0, 0)) << p.name;
    EXPECT_EQ(saved.count(p.name + ".step"), p.has_state ? 1u : 0u) << p.name;
    if (!p.has_state) continue;
    EXPECT_EQ(saved.at(p.name + ".step").ToVector<int64_t>(), std::vector<int64_t>{5});
    EXPECT_TRUE(tensor::testing::AllClose(saved.at(p.name + ".exp_avg"), p.buffers[0], 0, 0));
    EXPECT_TRUE(tensor::testing::AllClose(saved.at(p.name + ".exp_avg_sq"), p.buffers[1], 0, 0));
  }
  absl::StatusOr<CheckpointSummary> summary = ReadCheckpointSummary(out);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_FALSE(summary->sharded);
  EXPECT_EQ(summary->state.step, 5);
  EXPECT_EQ(summary->state.loader_state, "loader");

  // The reverse streams too: the single-process folder sharded again holds
  // the same parameters and state, read one parameter at a time.
  const std::string again = root + "/sharded_again";
  ledger.ResetPeaks();
  const int64_t before_shard = ledger.Total(tensor::Device::Cpu()).current;
  s = ShardSingleProcessCheckpoint(out, again);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_LE(ledger.Total(tensor::Device::Cpu()).peak - before_shard, 4 * param_bytes + 4096);
  size_t seen = 0;
  s = dist::ForEachWholeParameter(again, true, [&](const dist::WholeParameter& p) {
    const dist::WholeParameter& want = params.at(seen++);
    EXPECT_EQ(p.name, want.name);
    EXPECT_TRUE(tensor::testing::AllClose(p.value, want.value, 0, 0)) << p.name;
    EXPECT_EQ(p.has_state, want.has_state) << p.name;
    for (size_t k = 0; k < want.buffers.size(); ++k) {
      EXPECT_TRUE(tensor::testing::AllClose(p.buffers.at(k), want.buffers[k], 0, 0)) << p.name;
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(seen, params.size());

  // A shard file cut short: an error naming it, and nothing at the target.
  const std::string broken = root + "/broken";
  std::filesystem::copy(sharded, broken);
  for (const auto& e : std::filesystem::directory_iterator(broken)) {
    if (e.path().extension() == ".safetensors") {
      std::filesystem::resize_file(e.path(), std::filesystem::file_size(e.path()) - 100);
    }
  }
  s = ConsolidateShardedCheckpoint(broken, root + "/from_broken");
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(std::filesystem::exists(root + "/from_broken"));
  for (const auto& e : std::filesystem::directory_iterator(root)) {
    EXPECT_EQ(e.path().filename().string().find("from_broken"), std::string::npos) << e.path();
  }
}

// The names in folder `dir`, sorted ("" for a missing folder).
std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; ++it) {
    names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

// A new folder is written whole or not at all: in a temporary folder beside
// it, renamed into place when the write succeeds and removed when it fails.
TEST(WriteFreshFolderTest, AFolderAppearsWholeOrNotAtAll) {
  const std::string root = ::testing::TempDir() + "/fresh";
  std::filesystem::remove_all(root);
  const std::string out = root + "/a/out";  // its parents are created
  // While the write runs, `out` does not exist yet; a failed write leaves
  // nothing (not `out`, not the temporary folder) and is returned as it is.
  absl::Status s = WriteFreshFolder(out, "test", [&](const std::string& tmp) {
    EXPECT_EQ(std::filesystem::path(tmp).parent_path(), std::filesystem::path(root + "/a"));
    EXPECT_FALSE(std::filesystem::exists(out));
    WriteText(tmp + "/half.bin", "half");
    return absl::DataLossError("the source broke halfway");
  });
  EXPECT_EQ(s, absl::DataLossError("the source broke halfway"));
  EXPECT_EQ(Names(root + "/a"), std::vector<std::string>{});
  // Run again as it was: it succeeds, and the folder holds what was written.
  s = WriteFreshFolder(out + "/", "test", [&](const std::string& tmp) {
    WriteText(tmp + "/model.bin", "weights");
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(Names(root + "/a"), std::vector<std::string>{"out"});
  EXPECT_EQ(Names(out), std::vector<std::string>{"model.bin"});
  // A folder that holds files: refused before anything is written.
  bool wrote = false;
  s = WriteFreshFolder(out, "test", [&](const std::string&) {
    wrote = true;
    return absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_FALSE(wrote);
  EXPECT_EQ(Names(out), std::vector<std::string>{"model.bin"});
  // A folder that appears at `out` while it is written (another run) is
  // left as it is, and said.
  const std::string raced = root + "/raced";
  s = WriteFreshFolder(raced, "test", [&](const std::string& tmp) {
    WriteText(tmp + "/mine.bin", "mine");
    std::filesystem::create_directories(raced);
    WriteText(raced + "/theirs.bin", "theirs");
    return absl::OkStatus();
  });
  EXPECT_EQ(s, absl::AlreadyExistsError("'" + raced + "' was filled while it was being written; "
                                        "it was left as it is"));
  EXPECT_EQ(Names(raced), std::vector<std::string>{"theirs.bin"});
  // Even an empty one made meanwhile (another run about to write into it).
  const std::string made = root + "/made";
  s = WriteFreshFolder(made, "test", [&](const std::string& tmp) {
    std::filesystem::create_directories(made);
    return absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  std::filesystem::remove(made);
  // An empty folder found there is replaced, keeping its permissions;
  // "OUT/." is OUT; a folder without a name is refused.
  const std::string plain = root + "/plain";
  std::filesystem::create_directories(plain);
  std::filesystem::permissions(plain, std::filesystem::perms::owner_all);  // 0700
  s = WriteFreshFolder(plain + "/.", "test", [&](const std::string& tmp) {
    EXPECT_EQ(std::filesystem::path(tmp).parent_path(), std::filesystem::path(root));
    WriteText(tmp + "/model.bin", "weights");
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(Names(plain), std::vector<std::string>{"model.bin"});
  EXPECT_EQ(std::filesystem::status(plain).permissions(), std::filesystem::perms::owner_all);
  std::filesystem::remove_all(plain);
  EXPECT_EQ(WriteFreshFolder("", "test", [](const std::string&) { return absl::OkStatus(); })
                .code(),
            absl::StatusCode::kInvalidArgument);
  // The writer's error names the folder as given; a throw cleans up too.
  s = WriteFreshFolder(root + "/b", "test", [&](const std::string& tmp) {
    return absl::UnavailableError("cannot write '" + tmp + "/x.bin'");
  });
  EXPECT_EQ(s, absl::UnavailableError("cannot write '" + root + "/b/x.bin'"));
  EXPECT_THROW(WriteFreshFolder(root + "/b", "test",
                                [&](const std::string&) -> absl::Status { throw 7; }),
               int);
  EXPECT_EQ(Names(root), (std::vector<std::string>{"a", "raced"}));
  // An empty folder (here through a link: the link stays) is written in
  // place, and emptied again when the write fails.
  const std::string empty = root + "/empty";
  std::filesystem::create_directories(empty);
  const std::string link = root + "/link";
  std::filesystem::create_directory_symlink(empty, link);
  s = WriteFreshFolder(link, "test", [&](const std::string& folder) {
    WriteText(folder + "/half.bin", "half");
    return absl::DataLossError("broke");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(Names(empty), std::vector<std::string>{});
  s = WriteFreshFolder(link, "test", [&](const std::string& folder) {
    WriteText(folder + "/config.json", "{}");
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  EXPECT_EQ(Names(empty), std::vector<std::string>{"config.json"});
  EXPECT_EQ(Names(root), (std::vector<std::string>{"a", "empty", "link", "raced"}));
}

// A write that was killed leaves its temporary folder; the next write to the
// same folder on this host removes it (its process gone, its lock free) and
// says so, and leaves alone those of a live process, of another host, whose
// lock is held, of another folder, and names it did not make.
TEST(WriteFreshFolderTest, TheNextWriteRemovesWhatAKilledOneLeft) {
  const std::string root = ::testing::TempDir() + "/killed";
  std::filesystem::remove_all(root);
  const std::string out = root + "/out";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // killed halfway through its write
    (void)WriteFreshFolder(out, "consolidate", [&](const std::string& tmp) -> absl::Status {
      WriteText(tmp + "/half.bin", "half");
      ::_exit(9);
    });
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 9);
  const std::vector<std::string> left = Names(root);
  ASSERT_EQ(left.size(), 1u);
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  EXPECT_EQ(left[0].rfind(absl::StrCat("out.tmp-consolidate@", host, "-", child, "-"), 0), 0u)
      << left[0];
  // Another killed write of this host (a name with '-'): removed too.
  const std::string export_hf = absl::StrCat("out.tmp-export-hf@", host, "-", child, "-ef");
  // Kept: a live process's (this one's); another host's, whose name ends in
  // this host's; one whose lock is held (its pid gone); another folder's; a
  // name not made by a write.
  const std::vector<std::string> kept = {
      absl::StrCat("out.tmp-consolidate@", host, "-", ::getpid(), "-ab"),
      absl::StrCat("out.tmp-consolidate@x-", host, "-", child, "-cd"),
      absl::StrCat("out.tmp-export-hf@", host, "-", child, "-12"),
      absl::StrCat("out2.tmp-consolidate@", host, "-", child, "-cd"),
      absl::StrCat("out.tmp-consolidate@", host, "-", child, "-zz"),
      absl::StrCat("out.tmp-consolidate@", host, "-+", child, "-cd"),
      "out.tmp-notes"};
  std::filesystem::create_directories(root + "/" + export_hf);
  for (const std::string& k : kept) std::filesystem::create_directories(root + "/" + k);
  const int held = ::open((root + "/" + kept[2]).c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX), 0);
  ::testing::internal::CaptureStderr();
  absl::Status s = WriteFreshFolder(out, "consolidate", [&](const std::string& tmp) {
    WriteText(tmp + "/model.bin", "weights");
    return absl::OkStatus();
  });
  const std::string said = ::testing::internal::GetCapturedStderr();
  ::close(held);
  ASSERT_TRUE(s.ok()) << s;
  std::vector<std::string> want = kept;
  want.push_back("out");
  std::sort(want.begin(), want.end());
  EXPECT_EQ(Names(root), want);
  EXPECT_EQ(Names(out), std::vector<std::string>{"model.bin"});
  const std::string dir = std::filesystem::path(root).lexically_normal().string();
  EXPECT_TRUE(absl::StrContains(
      said, absl::StrCat("note: removed ", dir, "/", left[0], ": the consolidate run that wrote "
                         "it (pid ", child, " on this host) was killed\n")))
      << said;
  EXPECT_TRUE(absl::StrContains(
      said, absl::StrCat("note: removed ", dir, "/", export_hf, ": the export-hf run that")))
      << said;
  // A writer whose pid is gone but whose lock is held (here a child it
  // forked holds it; a writer in another pid namespace, whose pid cannot be
  // seen, looks the same): its folder is kept until the lock is free.
  const std::string out3 = root + "/out3";
  const pid_t writer = ::fork();
  ASSERT_GE(writer, 0);
  if (writer == 0) {
    (void)WriteFreshFolder(out3, "consolidate", [&](const std::string&) -> absl::Status {
      const pid_t holder = ::fork();  // inherits the writer's locked descriptor
      if (holder == 0) {
        ::sleep(60);
        ::_exit(0);
      }
      WriteText(root + "/holder.pid", absl::StrCat(holder));
      ::_exit(9);
    });
    ::_exit(0);
  }
  ASSERT_EQ(::waitpid(writer, &status, 0), writer);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 9);
  int holder = 0;
  {
    std::ifstream in(root + "/holder.pid");
    ASSERT_TRUE(in >> holder);
  }
  std::filesystem::remove(root + "/holder.pid");
  auto tmp3 = [&] {
    for (const std::string& n : Names(root)) {
      if (n.rfind("out3.tmp-", 0) == 0) return n;
    }
    return std::string();
  };
  const std::string locked = tmp3();
  ASSERT_FALSE(locked.empty());
  s = WriteFreshFolder(out3, "consolidate", [](const std::string&) {
    return absl::AbortedError("only the cleanup was wanted");
  });
  EXPECT_EQ(tmp3(), locked);  // kept: its lock is held
  ASSERT_EQ(::kill(holder, SIGKILL), 0);
  const int fd = ::open((root + "/" + locked).c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);  // waits for the holder's exit
  ::close(fd);
  s = WriteFreshFolder(out3, "consolidate", [](const std::string&) { return absl::OkStatus(); });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(tmp3(), "");  // removed once its lock was free
  // `what` is part of the name: lower-case letters and '-' only.
  EXPECT_EQ(WriteFreshFolder(out + "x", "Bad@", [](const std::string&) {
              return absl::OkStatus();
            }).code(),
            absl::StatusCode::kInvalidArgument);
  std::filesystem::remove_all(root);
}

// The recorded checkpoint of a run: found through the directory's `latest`,
// or named as a step folder; a missing folder or a checkpoint without a
// recorded config says so.
TEST(RecordedCheckpointTest, ConfigTokenizerAndStepOfEitherPath) {
  const std::string root = ::testing::TempDir() + "/recorded";
  std::filesystem::remove_all(root);
  std::vector<dist::WholeParameter> params(1);
  params[0].name = "w";
  params[0].value = tensor::testing::RandomTensor({4, 4}, 1);
  TrainState state;
  state.step = 12;
  state.loader_state = "loader";
  state.extra["config"] = "some-model(n=4)";
  state.extra["tokenizer"] = "gpt2";
  const std::string step_dir = root + "/run/" + CheckpointStepName(12);
  ASSERT_TRUE(
      dist::WriteWholeParameters(step_dir, params, "adamw", {}, ShardedCheckpointExtra(state))
          .ok());
  ASSERT_TRUE(SetLatestCheckpoint(root + "/run", 12).ok());
  for (const std::string& path : {root + "/run", step_dir}) {
    absl::StatusOr<RecordedCheckpoint> r = ReadRecordedCheckpoint(path);
    ASSERT_TRUE(r.ok()) << path << ": " << r.status();
    EXPECT_EQ(r->step_dir, step_dir);
    EXPECT_EQ(r->config, "some-model(n=4)");
    EXPECT_EQ(r->tokenizer, "gpt2");
    EXPECT_EQ(r->description, "checkpoint " + step_dir + " (step 12)");
  }

  absl::StatusOr<RecordedCheckpoint> missing =
      ReadRecordedCheckpoint(root + "/none", "no such run");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message().rfind("no such run: ", 0), 0u) << missing.status();
  EXPECT_NE(missing.status().message().find(root + "/none"), std::string::npos) << missing.status();

  // A checkpoint directory whose `latest` names a step that is gone is said
  // as such (was "cannot open '<dir>/model.safetensors'"), without the
  // caller's "not a checkpoint" words.
  ASSERT_TRUE(SetLatestCheckpoint(root + "/run", 13).ok());
  absl::StatusOr<RecordedCheckpoint> dangling = ReadRecordedCheckpoint(root + "/run", "neither");
  EXPECT_EQ(dangling.status().code(), absl::StatusCode::kDataLoss) << dangling.status();
  EXPECT_EQ(dangling.status().message().rfind(root + "/run/latest names step_000013, which is "
                                             "missing; the other checkpoints in ",
                                             0),
            0u)
      << dangling.status();
  EXPECT_NE(dangling.status().message().find("newest first: step_000012"), std::string::npos);

  // A single-process folder kept without its optimizer.safetensors (the
  // model alone) is read for its model; the summary says it has no optimizer.
  const std::string alone = root + "/alone";
  ASSERT_TRUE(std::filesystem::create_directories(alone));
  absl::Status written = WriteCheckpointFiles(alone, {{"w", params[0].value}}, {}, "adamw", state);
  ASSERT_TRUE(written.ok()) << written;
  ASSERT_TRUE(std::filesystem::remove(alone + "/optimizer.safetensors"));
  absl::StatusOr<RecordedCheckpoint> kept = ReadRecordedCheckpoint(alone);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->config, "some-model(n=4)");
  absl::StatusOr<CheckpointSummary> summary = ReadCheckpointSummary(alone);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_TRUE(summary->model_only);
  EXPECT_EQ(summary->optimizer, "");
  EXPECT_FALSE(summary->has_optimizer_state);
  ASSERT_EQ(summary->params.size(), 1u);
  absl::StatusOr<tensor::NamedTensors> model = ReadCheckpointModel(alone);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE(tensor::testing::AllClose(model->at(0).second, params[0].value, 0, 0));

  state.extra.clear();
  const std::string bare = root + "/bare";
  ASSERT_TRUE(
      dist::WriteWholeParameters(bare, params, "adamw", {}, ShardedCheckpointExtra(state)).ok());
  absl::StatusOr<RecordedCheckpoint> no_config = ReadRecordedCheckpoint(bare);
  ASSERT_FALSE(no_config.ok());
  EXPECT_EQ(no_config.status().message(),
            bare + " records no model configuration: not a checkpoint of a train binary");
}

}  // namespace
}  // namespace train
