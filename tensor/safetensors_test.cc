// safetensors: round trips, files written by other tools, slices, and clear
// errors for truncated, corrupted and malformed files.
#include "tensor/safetensors.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "tensor/testing.h"

namespace tensor {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), bytes.size());
}

TEST(SafetensorsTest, RoundTripEveryDtypeAndMetadata) {
  const std::string path = TempPath("round_trip.safetensors");
  NamedTensors in = {
      {"transformer.wte.weight", testing::RandomTensor({5, 3}, 1)},
      {"half", testing::RandomTensor({4}, 2, -1, 1, Dtype::kF16)},
      {"b16", testing::RandomTensor({2, 2}, 3, -1, 1, Dtype::kBF16)},
      {"step", Tensor::FromVector({7}, {1}, Dtype::kI64)},
      {"ids", Tensor::FromVector({1, 2, 3}, {3}, Dtype::kI32)},
      {"mask", Tensor::FromVector({0, 1}, {2}, Dtype::kU8)},
      {"scalar", Tensor::FromVector({2.5f}, {})},
      {"view", testing::RandomTensor({3, 4}, 4).Transpose(0, 1)},  // non-contiguous
  };
  ASSERT_TRUE(WriteSafetensors(path, in, {{"format", "pt"}}).ok());
  EXPECT_NE(access((path + ".tmp." + std::to_string(getpid())).c_str(), F_OK), 0);
  auto file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->tensors.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(file->tensors[i].first, in[i].first);
    EXPECT_EQ(file->tensors[i].second.dtype(), in[i].second.dtype());
    EXPECT_EQ(file->tensors[i].second.shape(), in[i].second.shape());
    EXPECT_TRUE(testing::AllClose(file->tensors[i].second, in[i].second, 0, 0)) << in[i].first;
  }
  EXPECT_EQ(file->header.metadata.at("format"), "pt");
  EXPECT_EQ(file->header.metadata.count("fsdp.crc32c"), 1u);
  // The header is 8-byte aligned JSON.
  const std::string bytes = ReadBytes(path);
  EXPECT_EQ(bytes[8], '{');
  EXPECT_EQ(file->header.data_start % 8, 0);
}

// The streaming writer gives the same bytes as WriteSafetensors (the
// checksum written into the header at the end), and refuses tensors out of
// the declared order, dtype or shape; an unfinished writer leaves nothing.
TEST(SafetensorsTest, StreamingWriterEqualsWholeWriteAndChecksItsInput) {
  const std::string whole = TempPath("whole.safetensors"),
                    streamed = TempPath("stream.safetensors");
  NamedTensors in = {
      {"a", testing::RandomTensor({5, 3}, 1)},
      {"b", testing::RandomTensor({2, 2}, 3, -1, 1, Dtype::kBF16)},
      {"c.step", Tensor::FromVector({7}, {1}, Dtype::kI64)},
  };
  const std::map<std::string, std::string> meta = {{"zz", "last"}, {"format", "pt"}};
  ASSERT_TRUE(WriteSafetensors(whole, in, meta).ok());
  std::vector<SafetensorsWriter::Decl> decls;
  for (const auto& [name, t] : in) decls.push_back({name, t.dtype(), t.shape()});
  auto w = SafetensorsWriter::Create(streamed, decls, meta);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->next_name(), "a");
  absl::Status s = (*w)->Append(in[1].second);  // "b" where "a" is next
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tensor 'a' is bf16 (2,2), declared f32 (5,3)"), std::string::npos)
      << s;
  ASSERT_TRUE((*w)->Append(in[0].second).ok());
  s = (*w)->Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("tensor 'b' (2 of 3) was declared and not written"), std::string::npos)
      << s;
  ASSERT_TRUE((*w)->Append(in[1].second).ok());
  ASSERT_TRUE((*w)->Append(in[2].second).ok());
  EXPECT_EQ((*w)->next_name(), "");
  EXPECT_FALSE((*w)->Append(in[2].second).ok());
  EXPECT_NE(access(streamed.c_str(), F_OK), 0);  // nothing at the path before Finish
  ASSERT_TRUE((*w)->Finish().ok());
  EXPECT_EQ(ReadBytes(streamed), ReadBytes(whole));
  auto file = ReadSafetensors(streamed);  // the checksum verifies
  ASSERT_TRUE(file.ok()) << file.status();

  // Dropped unfinished: the earlier file stays.
  {
    auto again = SafetensorsWriter::Create(streamed, decls);
    ASSERT_TRUE(again.ok());
    ASSERT_TRUE((*again)->Append(in[0].second).ok());
  }
  EXPECT_EQ(ReadBytes(streamed), ReadBytes(whole));
  auto twice = SafetensorsWriter::Create(streamed, {decls[0], decls[0]});
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
}

// A header that still parses and fits its data but says something else
// than it was written with (a metadata value, a shape of the same size) is
// refused by the header's checksum, before any data is read.
TEST(SafetensorsTest, AChangedHeaderIsRefused) {
  const std::string path = TempPath("header.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"w", testing::RandomTensor({5, 3}, 1)}}, {{"step", "100"}})
                  .ok());
  const std::string bytes = ReadBytes(path);
  ASSERT_TRUE(ReadSafetensorsHeader(path).ok());
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"100\"", "\"900\""}, {"[5,3]", "[3,5]"}}) {
    const size_t at = bytes.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    WriteBytes(path, bytes.substr(0, at) + to + bytes.substr(at + from.size()));
    absl::StatusOr<SafetensorsHeader> header = ReadSafetensorsHeader(path);
    EXPECT_EQ(header.status().code(), absl::StatusCode::kDataLoss) << to;
    EXPECT_NE(header.status().message().find("is corrupted: its header's checksum "),
              std::string::npos)
        << header.status();
  }
}

TEST(SafetensorsTest, ReadsAFileWithoutOurChecksum) {
  // As written by the Python safetensors package: no fsdp.crc32c, no padding.
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"format":"pt"}})";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  bytes += header;
  const float values[2] = {1.5f, -2.0f};
  bytes.append(reinterpret_cast<const char*>(values), 8);
  const std::string path = TempPath("foreign.safetensors");
  WriteBytes(path, bytes);
  auto file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->tensors[0].second.ToVector<float>(), (std::vector<float>{1.5f, -2.0f}));
}

TEST(SafetensorsTest, SliceReadsPartOfATensorWithConversion) {
  const std::string path = TempPath("slice.safetensors");
  Tensor w = testing::RandomTensor({10, 10}, 5);
  ASSERT_TRUE(WriteSafetensors(path, {{"w", w}, {"b", Tensor::Zeros({3})}}).ok());
  auto header = ReadSafetensorsHeader(path);
  ASSERT_TRUE(header.ok());
  Tensor part = Tensor::Empty({15});
  ASSERT_TRUE(ReadSafetensorsSlice(path, *header, "w", 42, part).ok());
  EXPECT_EQ(part.ToVector<float>(), w.Flatten().Narrow(0, 42, 15).ToVector<float>());
  Tensor half = Tensor::Empty({15}, Dtype::kBF16);
  ASSERT_TRUE(ReadSafetensorsSlice(path, *header, "w", 42, half).ok());
  EXPECT_TRUE(testing::AllClose(half, part, 0, 1e-2));
  absl::Status out_of_range = ReadSafetensorsSlice(path, *header, "w", 90, part);
  EXPECT_EQ(out_of_range.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ReadSafetensorsSlice(path, *header, "nope", 0, part).code(),
            absl::StatusCode::kNotFound);
}

TEST(SafetensorsTest, TruncatedFileIsAClearError) {
  const std::string path = TempPath("truncated.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"w", testing::RandomTensor({100}, 6)}}).ok());
  const std::string bytes = ReadBytes(path);
  WriteBytes(path, bytes.substr(0, bytes.size() - 10));
  auto file = ReadSafetensors(path);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(file.status().message().find("truncated"), std::string::npos) << file.status();
  WriteBytes(path, bytes.substr(0, 5));
  EXPECT_NE(ReadSafetensors(path).status().message().find("truncated"), std::string::npos);
}

// Bytes appended to a file (a second write, a copy's tail) are no tensor's:
// the file is refused rather than read as if whole.
TEST(SafetensorsTest, AppendedBytesAreAClearError) {
  const std::string path = TempPath("appended.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"w", testing::RandomTensor({100}, 6)}}).ok());
  WriteBytes(path, ReadBytes(path) + "garbage");
  const absl::Status s = ReadSafetensorsHeader(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("7 bytes follow the last tensor's data"), std::string::npos) << s;
  EXPECT_EQ(ReadSafetensors(path).status().code(), absl::StatusCode::kDataLoss);
}

TEST(SafetensorsTest, CorruptedDataIsCaughtByTheChecksum) {
  const std::string path = TempPath("corrupt.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"w", testing::RandomTensor({100}, 7)}}).ok());
  std::string bytes = ReadBytes(path);
  bytes[bytes.size() - 3] ^= 0x10;
  WriteBytes(path, bytes);
  auto file = ReadSafetensors(path);
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("corrupted: checksum"), std::string::npos)
      << file.status();
}

TEST(SafetensorsTest, MalformedHeadersAndMissingFiles) {
  const std::string path = TempPath("bad.safetensors");
  auto with_header = [&](const std::string& header, int data_bytes) {
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    WriteBytes(path, bytes + header + std::string(data_bytes, '\0'));
    return ReadSafetensors(path).status();
  };
  EXPECT_EQ(with_header("{not json", 0).code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(with_header(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)
                .message()
                .find("has 8 bytes for shape (3)"),
            std::string::npos);
  EXPECT_NE(with_header(R"({"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", 1)
                .message()
                .find("unsupported safetensors dtype 'Q4'"),
            std::string::npos);
  EXPECT_NE(with_header(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                        R"("b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})",
                        3)
                .message()
                .find("overlaps"),
            std::string::npos);
  // The data section is indexed whole: no hole, nothing after the last tensor.
  const absl::Status hole = with_header(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                                        R"("b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})",
                                        5);
  EXPECT_EQ(hole.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(hole.message().find("bytes [2, 3) of the data section belong to no tensor"),
            std::string::npos)
      << hole;
  // Fields of the wrong type: a shape that is not an array read as a scalar,
  // metadata that is not an object was ignored.
  for (const char* header : {R"({"a":{"dtype":"F32","shape":"x","data_offsets":[0,4]}})",
                             R"({"a":{"dtype":"F32","shape":null,"data_offsets":[0,4]}})",
                             R"({"a":{"dtype":["F32"],"shape":[1],"data_offsets":[0,4]}})"}) {
    const absl::Status s = with_header(header, 4);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << header;
    EXPECT_NE(s.message().find("entry 'a' needs a dtype string, a shape array and a "
                               "data_offsets array"),
              std::string::npos)
        << s;
  }
  const absl::Status metadata = with_header(
      R"({"__metadata__":"x","a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1);
  EXPECT_NE(metadata.message().find("__metadata__ must be an object of strings"),
            std::string::npos)
      << metadata;
  EXPECT_TRUE(with_header(R"({"__metadata__":null,"a":{"dtype":"U8","shape":[1],)"
                          R"("data_offsets":[0,1]}})",
                          1)
                  .ok());
  // A header longer than the reader takes, in a file long enough to hold it
  // (sparse): named as such, not as a truncated file.
  {
    std::string bytes(8, '\0');
    const uint64_t n = uint64_t{200} << 20;
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    WriteBytes(path, bytes);
    ASSERT_EQ(::truncate(path.c_str(), int64_t{300} << 20), 0);
    const absl::Status s = ReadSafetensors(path).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(s.message().find("header length 209715200 is more than the 104857600 bytes a "
                               "header may have"),
              std::string::npos)
        << s;
  }
  // Sizes that wrap in 64 bits: 4 * (2^62 + 1) bytes, and 2^32 * 2^32 elements.
  for (const char* header : {
           R"({"a":{"dtype":"F32","shape":[4611686018427387905],"data_offsets":[0,4]}})",
           R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})"}) {
    const absl::Status s = with_header(header, 4);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << header;
    EXPECT_NE(s.message().find("entry 'a' has shape"), std::string::npos) << s;
    EXPECT_NE(s.message().find("more than 2^63-1 bytes"), std::string::npos) << s;
  }
  // A name twice: the reader and Find would disagree on which is meant.
  const absl::Status twice =
      with_header(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                  R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                  2);
  EXPECT_EQ(twice.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(twice.message().find("entry 'a' appears twice"), std::string::npos) << twice;
  absl::Status missing = ReadSafetensors(TempPath("does_not_exist.safetensors")).status();
  EXPECT_NE(missing.message().find("cannot open"), std::string::npos);
  EXPECT_FALSE(WriteSafetensors("/nonexistent_dir/x.safetensors", {{"a", Tensor::Zeros({1})}}).ok());
}

// A header of zeros in one shape would make a huge parse and a Shape of that
// rank: the rank is capped (and the JSON parser's values, see json_test).
TEST(SafetensorsTest, HugeRankIsRefused) {
  const std::string path = TempPath("huge_rank.safetensors");
  std::string header = R"({"a":{"dtype":"U8","data_offsets":[0,0],"shape":[0)";
  for (int i = 1; i < (1 << 20); ++i) header += ",0";
  header += "]}}";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  WriteBytes(path, bytes + header);
  const absl::Status s = ReadSafetensors(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("rank 1048576 of entry 'a' is more than 64"), std::string::npos)
      << s.message().substr(0, 200);
}

TEST(SafetensorsTest, Crc32cKnownValue) {
  // RFC 3720 test vector: 32 bytes of zeros -> 0x8a9136aa.
  const std::string zeros(32, '\0');
  EXPECT_EQ(Crc32c(zeros.data(), zeros.size()), 0x8a9136aau);
  EXPECT_EQ(Crc32c("123456789", 9), 0xe3069283u);
}

}  // namespace
}  // namespace tensor
