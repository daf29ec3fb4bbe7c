// The sharded checkpoint format without a process group: index.json written
// and read back gives the same records (and the same text); every malformed
// index is refused with a message that names the field or the parameter;
// ReadIndex's errors name the folder or the file; the format's names and
// block checksums.
#include "dist/sharded_checkpoint_index.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/safetensors.h"

namespace dist::sharded {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

SliceRec Slice(int file, const std::string& kind, const std::string& param, int64_t begin,
               int64_t end, std::vector<uint32_t> crcs) {
  SliceRec s;
  s.file = file;
  s.tensor = SliceTensorName(kind, param, begin);
  s.begin = begin;
  s.end = end;
  s.crcs = std::move(crcs);
  return s;
}

// Two files, checksum blocks of 4 elements; a parameter split across the
// files with optimizer state, one without state, and one without elements.
Index Sample() {
  Index x;
  x.id = "0123456789abcdef00004d2a";
  x.writer = "fsdp";
  x.strategy = "FULL_SHARD";
  x.world_size = 4;
  x.units = {"", "transformer.h.0"};
  x.files = {{"shard_0_of_2.safetensors", 1234}, {"shard_1_of_2.safetensors", 987}};
  x.crc_block = 4;
  x.optimizer = "adamw";
  x.buffers = {"exp_avg", "exp_avg_sq"};
  x.lr = "0.00029999999999999997";
  x.has_state = true;
  x.step = 3;

  const std::string w = "transformer.wte.weight";
  ParamRec wte;
  wte.name = w;
  wte.shape = {2, 3};
  wte.numel = 6;
  wte.value = {Slice(0, kValueKind, w, 0, 4, {0x01234567}), Slice(1, kValueKind, w, 4, 6, {7})};
  wte.has_state = true;
  wte.step = 3;
  for (const std::string& b : x.buffers) {
    wte.state[b] = {Slice(0, b, w, 0, 4, {0xffffffff}), Slice(1, b, w, 4, 6, {0})};
  }
  ParamRec bias;
  bias.name = "lm_head.bias";
  bias.shape = {5};
  bias.numel = 5;
  bias.value = {Slice(1, kValueKind, bias.name, 0, 5, {0xdeadbeef, 0x89abcdef})};
  ParamRec empty;
  empty.name = "empty";
  empty.shape = {0};
  empty.has_state = true;
  empty.step = 3;
  empty.state = {{"exp_avg", {}}, {"exp_avg_sq", {}}};
  x.params = {wte, bias, empty};
  x.extra = {{"step", "100"}, {"loader", "{\"pos\": 3}\n\\\t"}, {"note", "h\xc3\xa9llo"}};
  return x;
}

std::string Dump(const std::vector<SliceRec>& slices) {
  std::vector<std::string> parts;
  for (const SliceRec& s : slices) {
    parts.push_back(absl::StrCat("#", s.file, " ", s.tensor, " [", s.begin, ", ", s.end, ") crc ",
                                 absl::StrJoin(s.crcs, ",")));
  }
  return absl::StrCat("[", absl::StrJoin(parts, "; "), "]");
}

// Every field of `x`, a line per file, parameter and extra entry, so that
// EXPECT_EQ on two dumps shows what differs.
std::string Dump(const Index& x) {
  std::vector<std::string> lines = {
      absl::StrCat("version ", x.version, " id ", x.id, " writer ", x.writer, " strategy ",
                   x.strategy, " world_size ", x.world_size, " units ",
                   absl::StrJoin(x.units, "|")),
      absl::StrCat("crc_block ", x.crc_block, " optimizer ", x.optimizer, " buffers ",
                   absl::StrJoin(x.buffers, "|"), " lr ", x.lr, " has_state ", x.has_state,
                   " step ", x.step)};
  for (const FileRec& f : x.files) lines.push_back(absl::StrCat("file ", f.name, " ", f.bytes));
  for (const ParamRec& p : x.params) {
    std::string line =
        absl::StrCat("param ", p.name, " ", p.shape.ToString(), " numel ", p.numel, " value ",
                     Dump(p.value), " has_state ", p.has_state, " step ", p.step);
    for (const auto& [key, slices] : p.state) absl::StrAppend(&line, " ", key, " ", Dump(slices));
    lines.push_back(std::move(line));
  }
  if (!x.model_buffers.tensors.empty()) {
    lines.push_back(absl::StrCat("buffers file bytes ", x.model_buffers.bytes));
  }
  for (const BufferRec& b : x.model_buffers.tensors) {
    lines.push_back(absl::StrCat("buffer ", b.name, " ", b.shape.ToString(), " ",
                                 tensor::DtypeName(b.dtype), " crc ", b.crc));
  }
  for (const auto& [k, v] : x.extra) {
    lines.push_back(absl::StrCat("extra ", k, " = \"", absl::CEscape(v), "\""));
  }
  for (const auto& [name, i] : x.by_name) lines.push_back(absl::StrCat("by_name ", name, " ", i));
  return absl::StrJoin(lines, "\n");
}

// A fresh folder under the test's temporary directory.
std::string FreshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/sharded_checkpoint_index_test/" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

TEST(ShardedCheckpointIndexTest, WriteThenReadGivesTheSameRecords) {
  Index want = Sample();
  ASSERT_TRUE(ValidateIndex(want).ok());
  EXPECT_EQ(want.by_name.size(), 3u);
  EXPECT_EQ(want.by_name.at("lm_head.bias"), 1u);
  const std::string text = IndexToJson(want);

  absl::StatusOr<Index> parsed = ParseIndex(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(Dump(*parsed), Dump(want));
  EXPECT_EQ(IndexToJson(*parsed), text);

  const std::string dir = FreshDir("round_trip");
  WriteText(dir + "/" + kIndexFile, text);
  absl::StatusOr<Index> read = ReadIndex(dir);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(Dump(*read), Dump(want));
}

TEST(ShardedCheckpointIndexTest, WithoutOptimizerState) {
  Index want = Sample();
  want.has_state = false;
  want.step = -1;
  want.buffers.clear();
  for (ParamRec& p : want.params) {
    p.has_state = false;
    p.step = 0;
    p.state.clear();
  }
  ASSERT_TRUE(ValidateIndex(want).ok());
  absl::StatusOr<Index> parsed = ParseIndex(IndexToJson(want));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(Dump(*parsed), Dump(want));
}

TEST(ShardedCheckpointIndexTest, ReadingSortsSlices) {
  Index x = Sample();
  std::swap(x.params[0].value[0], x.params[0].value[1]);
  std::swap(x.params[0].state["exp_avg"][0], x.params[0].state["exp_avg"][1]);
  absl::StatusOr<Index> parsed = ParseIndex(IndexToJson(x));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  Index want = Sample();
  ASSERT_TRUE(ValidateIndex(want).ok());
  EXPECT_EQ(Dump(*parsed), Dump(want));
}

// `text` with its one occurrence of `from` replaced by `to`.
std::string Edit(const std::string& text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << "'" << from << "' is not in the index";
  if (at == std::string::npos) return text;
  EXPECT_EQ(text.find(from, at + 1), std::string::npos) << "'" << from << "' is there twice";
  return text.substr(0, at) + to + text.substr(at + from.size());
}

struct TextCase {
  std::string from;
  std::string to;
  absl::StatusCode code;
  std::string message;
};

TEST(ShardedCheckpointIndexTest, MalformedTextIsRefused) {
  const std::string text = IndexToJson(Sample());
  const absl::StatusCode kDataLoss = absl::StatusCode::kDataLoss;
  const absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
  const std::vector<TextCase> cases = {
      {"\"format\": \"fsdp.sharded_checkpoint\"", "\"format\": \"other\"", kInvalid,
       "format is 'other', expected 'fsdp.sharded_checkpoint'"},
      {"\"version\": 1,", "\"version\": 3,", kInvalid,
       "format version 3 (this build reads versions 1 to 2; written by a newer build)"},
      {"\"version\": 1,", "\"version\": 0,", kInvalid,
       "format version 0 (this build reads versions 1 to 2)"},
      {"\"version\": 1,", "\"version\": 2,", kDataLoss,
       "format version 2 needs a \"buffers\" field"},
      {"\"checkpoint_id\"", "\"id\"", kDataLoss, ".checkpoint_id is missing"},
      {"\"world_size\": 4", "\"world_size\": \"4\"", kDataLoss, ".world_size has the wrong type"},
      {"\"world_size\": 4", "\"world_size\": 4.5", kDataLoss, ".world_size is not an integer"},
      {"{\"name\": \"shard_1_of_2.safetensors\", \"bytes\": 987}", "\"shard_1_of_2.safetensors\"",
       kDataLoss, "files[] entry is not an object"},
      {"\"bytes\": 987", "\"bytes\": \"987\"", kDataLoss, "files[1].bytes has the wrong type"},
      {"\"has_state\": true", "\"has_state\": 1", kDataLoss,
       "optimizer.has_state has the wrong type"},
      {"\"params\": [\n", "\"params\": [\n    3,\n", kDataLoss, "params[0] is not an object"},
      {"\"shape\": [5]", "\"shape\": [5, -1]", kDataLoss, "params[1].shape is not a shape"},
      {"\"numel\": 5, \"dtype\": \"F32\"", "\"numel\": 5, \"dtype\": \"BF16\"", kDataLoss,
       "params[1].dtype is BF16, expected F32"},
      {"{\"file\": 1, \"tensor\": \"model/lm_head.bias@0\"",
       "7, {\"file\": 1, \"tensor\": \"model/lm_head.bias@0\"", kDataLoss,
       "params[1].value[0] is not an object"},
      {"\"deadbeef\"", "\"deadbeeg\"", kDataLoss, "params[1].value[0].crc32c holds a bad checksum"},
      {"\"deadbeef\"", "\"beef\"", kDataLoss, "params[1].value[0].crc32c holds a bad checksum"},
      {"\"exp_avg\": []", "\"exp_avg\": {}", kDataLoss, "params[2].state.exp_avg is not an array"},
      {"\"exp_avg\": []", "\"exp_avg\": [], \"foo\": []", kDataLoss,
       "parameter 'empty': unknown optimizer buffer 'foo'"},
      {"\"exp_avg\": [],\n      \"exp_avg_sq\": []", "\"exp_avg\": []", kDataLoss,
       "parameter 'empty': optimizer buffer 'exp_avg_sq' is missing"},
      {"\"numel\": 5, \"dtype\": \"F32\"",
       "\"numel\": 5, \"dtype\": \"F32\", \"state\": {\"exp_avg\": []}", kDataLoss,
       "parameter 'lm_head.bias' has optimizer buffers but no step"},
      {"\"step\": \"100\"", "\"step\": 100", kDataLoss, "extra values must be strings"},
      // Integers out of range are refused, not truncated (an index without
      // its checksum is read as it is).
      {"\"world_size\": 4", "\"world_size\": 4294967300", kDataLoss,
       "world_size 4294967300 is not a world size"},
      {"\"world_size\": 4", "\"world_size\": 0", kDataLoss, "world_size 0 is not a world size"},
      {"{\"file\": 1, \"tensor\": \"model/lm_head.bias@0\"",
       "{\"file\": 4294967297, \"tensor\": \"model/lm_head.bias@0\"", kDataLoss,
       "params[1].value[0].file 4294967297 is not a file number"},
      {"\"shape\": [5]", "\"shape\": [5, 0, 4294967296, 4294967296]", kDataLoss,
       "params[1].shape has more elements than an int64 counts"},
      {"\"begin\": 0, \"end\": 5", "\"begin\": 0, \"end\": 9223372036854775807", kDataLoss,
       "parameter 'lm_head.bias': slice [0, 9223372036854775807) ends past its 5 elements"},
  };
  for (const TextCase& c : cases) {
    absl::StatusOr<Index> x = ParseIndex(Edit(text, c.from, c.to));
    ASSERT_FALSE(x.ok()) << c.message;
    EXPECT_EQ(x.status().code(), c.code) << c.message;
    EXPECT_EQ(x.status().message(), c.message);
  }

  absl::StatusOr<Index> x = ParseIndex("[1, 2]");
  EXPECT_EQ(x.status(), absl::DataLossError("not a JSON object"));
  x = ParseIndex(text.substr(0, text.size() / 2));
  EXPECT_EQ(x.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(x.status().message(), HasSubstr("bad JSON"));
}

// Module buffers (BatchNorm's running statistics): version 2, listed with
// their shapes, dtypes and checksums; malformed entries are refused.
TEST(ShardedCheckpointIndexTest, ModuleBuffers) {
  Index want = Sample();
  want.version = kVersion;
  want.model_buffers.bytes = 321;
  want.model_buffers.tensors = {{"bn.running_mean", {5}, tensor::Dtype::kF32, 0xabcdef01},
                                {"bn.num_batches_tracked", {}, tensor::Dtype::kI64, 7}};
  ASSERT_TRUE(ValidateIndex(want).ok());
  const std::string text = IndexToJson(want);
  EXPECT_THAT(text, HasSubstr("\"version\": 2,"));
  EXPECT_THAT(text, HasSubstr("\"buffers\": {\"file\": \"buffers.safetensors\", \"bytes\": 321"));
  absl::StatusOr<Index> parsed = ParseIndex(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(Dump(*parsed), Dump(want));
  EXPECT_EQ(IndexToJson(*parsed), text);

  const std::vector<TextCase> cases = {
      {"\"version\": 2,", "\"version\": 1,", absl::StatusCode::kDataLoss,
       "format version 1 must not have a \"buffers\" field"},
      {"\"dtype\": \"I64\"", "\"dtype\": \"int64\"", absl::StatusCode::kDataLoss,
       "buffers.tensors[1].dtype 'int64' is not a dtype"},
      {"\"shape\": [], ", "\"shape\": [-1], ", absl::StatusCode::kDataLoss,
       "buffers.tensors[1].shape is not a shape"},
      {"\"crc32c\": \"00000007\"", "\"crc32c\": \"7\"", absl::StatusCode::kDataLoss,
       "buffers.tensors[1].crc32c is not a checksum"},
      {"\"file\": \"buffers.safetensors\"", "\"file\": \"other.safetensors\"",
       absl::StatusCode::kDataLoss, "buffers.file is not buffers.safetensors"},
      {"\"name\": \"bn.num_batches_tracked\"", "\"name\": \"bn.running_mean\"",
       absl::StatusCode::kDataLoss, "buffer 'bn.running_mean' is listed twice or unnamed"},
  };
  for (const TextCase& c : cases) {
    absl::StatusOr<Index> x = ParseIndex(Edit(text, c.from, c.to));
    ASSERT_FALSE(x.ok()) << c.message;
    EXPECT_EQ(x.status().code(), c.code) << c.message;
    EXPECT_EQ(x.status().message(), c.message);
  }
  EXPECT_TRUE(IsCheckpointFile("buffers.safetensors"));
  EXPECT_TRUE(IsCheckpointFile("buffers.safetensors.tmp.123"));
}

// index.json ends with the checksum of its text: a change that still parses
// and validates (a step, a learning rate) is refused naming both checksums;
// an index without the field (an older writer's, or edited by hand with the
// field dropped) is read as it is.
TEST(ShardedCheckpointIndexTest, ATextChangedAfterWritingIsRefused) {
  const std::string text = IndexToJson(Sample());
  ASSERT_TRUE(ParseIndex(text).ok());
  const std::string line = "\n  \"index_crc32c\": \"";
  const size_t at = text.rfind(line);
  ASSERT_NE(at, std::string::npos);
  const std::string written = text.substr(at + line.size(), 8);
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"step\": \"100\"", "\"step\": \"900\""}, {"\"lr\": \"", "\"lr\": \"1"}}) {
    absl::StatusOr<Index> x = ParseIndex(Edit(text, from, to));
    ASSERT_FALSE(x.ok()) << to;
    EXPECT_EQ(x.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(x.status().message(),
                HasSubstr(absl::StrCat("its text does not match its checksum (index_crc32c ",
                                       written, ", the text's ")));
    EXPECT_THAT(x.status().message(), HasSubstr("must drop \"index_crc32c\""));
  }
  std::string reformatted = text;  // the field kept, the lines before it rewritten
  reformatted.erase(std::remove(reformatted.begin(), reformatted.end(), '\n'), reformatted.end());
  EXPECT_THAT(ParseIndex(reformatted).status().message(), HasSubstr(", the text's none)"));

  const std::string unchecked = text.substr(0, at - 1) + "\n}\n";  // without ",\n" and the field
  absl::StatusOr<Index> x =
      ParseIndex(Edit(unchecked, "\"step\": \"100\"", "\"step\": \"900\""));
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_EQ(x->extra.at("step"), "900");
}

struct RecordCase {
  std::function<void(Index&)> edit;
  std::string message;
};

TEST(ShardedCheckpointIndexTest, InconsistentRecordsAreRefused) {
  const std::string w = "parameter 'transformer.wte.weight'";
  const std::vector<RecordCase> cases = {
      {[](Index& x) { x.files[1].name = "../x"; }, "bad file entry '../x'"},
      {[](Index& x) { x.files[1].name = "a/b"; }, "bad file entry 'a/b'"},
      {[](Index& x) { x.files[1].name = x.files[0].name; },
       "bad file entry 'shard_0_of_2.safetensors'"},
      {[](Index& x) { x.files[1].bytes = -1; }, "bad file entry 'shard_1_of_2.safetensors'"},
      {[](Index& x) { x.crc_block = 0; }, "bad crc32c_block_elements 0 (must be in [1, 2^40])"},
      {[](Index& x) { x.crc_block = std::numeric_limits<int64_t>::max(); },
       "bad crc32c_block_elements 9223372036854775807 (must be in [1, 2^40])"},
      {[](Index& x) { x.params[1].name = x.params[0].name; }, w + " is listed twice"},
      {[](Index& x) { x.params[0].numel = 7; }, w + ": numel 7 does not match shape (2,3)"},
      {[](Index& x) { x.params[0].value[1].file = 2; },
       w + ": slice 'model/transformer.wte.weight@4' names file #2 of 2"},
      {[](Index& x) { x.params[0].value[1].begin = 5; },
       w + ": slices do not tile its 6 elements (a slice [5, 6) where element 4 was expected)"},
      {[](Index& x) { x.params[0].value.pop_back(); }, w + ": slices cover 4 of its 6 elements"},
      {[](Index& x) { x.params[0].value[0].crcs.push_back(1); },
       w + ": slice 'model/transformer.wte.weight@0' has 2 checksums for 1 blocks"},
      {[](Index& x) { x.has_state = false; },
       w + " has optimizer state but the optimizer has none"},
      {[](Index& x) { x.params[0].state["exp_avg_sq"].pop_back(); },
       w + " exp_avg_sq: slices cover 4 of its 6 elements"},
  };
  for (const RecordCase& c : cases) {
    Index x = Sample();
    c.edit(x);
    Index y = x;
    EXPECT_EQ(ValidateIndex(y), absl::DataLossError(c.message));
    absl::StatusOr<Index> parsed = ParseIndex(IndexToJson(x));
    EXPECT_EQ(parsed.status(), absl::DataLossError(c.message));
  }
}

TEST(ShardedCheckpointIndexTest, ReadIndexErrorsNameTheFolderOrTheFile) {
  const std::string dir = FreshDir("errors");
  absl::StatusOr<Index> x = ReadIndex(dir + "/nothing");
  EXPECT_EQ(x.status(),
            absl::NotFoundError("checkpoint folder '" + dir + "/nothing' does not exist"));

  WriteText(dir + "/file", "x");
  x = ReadIndex(dir + "/file");
  EXPECT_EQ(x.status(), absl::InvalidArgumentError("'" + dir + "/file' is not a folder"));

  const std::string path = dir + "/" + kIndexFile;
  x = ReadIndex(dir);
  EXPECT_EQ(x.status(),
            absl::NotFoundError("'" + path +
                                "' is missing: not a sharded checkpoint, or written by a world "
                                "that did not finish its save (shard files without index.json "
                                "are never valid)"));

  WriteText(path, "{\"format\": \"other\"}");
  x = ReadIndex(dir);
  EXPECT_EQ(x.status(), absl::InvalidArgumentError("'" + path +
                                                   "' is invalid: format is 'other', expected "
                                                   "'fsdp.sharded_checkpoint'"));

  WriteText(path, "{\"format\": ");
  x = ReadIndex(dir);
  EXPECT_EQ(x.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(x.status().message(), HasSubstr("'" + path + "' is invalid: bad JSON"));
}

TEST(ShardedCheckpointIndexTest, Names) {
  EXPECT_EQ(ShardFileName(1, 4), "shard_1_of_4.safetensors");
  EXPECT_EQ(SliceTensorName(kValueKind, "lm_head.weight", 12), "model/lm_head.weight@12");
  EXPECT_EQ(SliceTensorName("exp_avg", "lm_head.weight", 0), "optim/exp_avg/lm_head.weight@0");
  EXPECT_EQ(Hex32(0xab), "000000ab");
  EXPECT_EQ(Hex32(0xdeadbeef), "deadbeef");
  for (const std::string name : {"index.json", "index.json.tmp.123", "shard_0_of_2.safetensors",
                                 "shard_10_of_12.safetensors.tmp.77"}) {
    EXPECT_TRUE(IsCheckpointFile(name)) << name;
  }
  for (const std::string name : {"notes.txt", "index.json.bak", "shard_0_of_2.safetensorsx",
                                 "shard_a_of_2.safetensors", "shard_0_of_2.bin"}) {
    EXPECT_FALSE(IsCheckpointFile(name)) << name;
  }
}

TEST(ShardedCheckpointIndexTest, BlockCrcs) {
  std::vector<float> data(10);
  for (size_t i = 0; i < data.size(); ++i) data[i] = 0.5f * static_cast<float>(i);
  const std::vector<uint32_t> crcs = BlockCrcs(data.data(), 10, 4);
  EXPECT_EQ(crcs, (std::vector<uint32_t>{tensor::Crc32c(data.data(), 16),
                                         tensor::Crc32c(data.data() + 4, 16),
                                         tensor::Crc32c(data.data() + 8, 8)}));
  EXPECT_EQ(BlockCrcs(data.data(), 8, 4).size(), 2u);
  EXPECT_EQ(BlockCrcs(data.data(), 10, 16),
            (std::vector<uint32_t>{tensor::Crc32c(data.data(), 40)}));
  EXPECT_TRUE(BlockCrcs(data.data(), 0, 4).empty());
}

}  // namespace
}  // namespace dist::sharded
