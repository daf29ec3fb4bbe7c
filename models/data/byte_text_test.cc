// Byte text: the shipped default text, samples that are windows of the text
// (byte values exactly), decoding, and errors for missing and empty files.
#include "models/data/byte_text.h"

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace data {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

std::vector<int64_t> Sample(const TokenSource& s, int64_t step, int64_t row, int64_t n) {
  std::vector<int64_t> out(n);
  s.SampleSequence(step, row, absl::MakeSpan(out));
  return out;
}

TEST(ByteTextTest, DefaultTextIsShippedAndReadable) {
  auto source = ByteTextSource::OpenDefault(1);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ((*source)->vocab_size(), 256);
  EXPECT_EQ((*source)->max_sequence_length(), 567198);
  EXPECT_EQ((*source)->text().substr(0, 20), "Produced by Suzanne ");
  EXPECT_NE((*source)->text().find("OPTICKS"), absl::string_view::npos);
  EXPECT_NE((*source)->Describe().find("newton_opticks.txt (567198 bytes)"), std::string::npos)
      << (*source)->Describe();
}

TEST(ByteTextTest, SamplesAreWindowsOfTheTextWithByteValues) {
  auto source = ByteTextSource::OpenDefault(3);
  ASSERT_TRUE(source.ok()) << source.status();
  const absl::string_view text = (*source)->text();
  bool saw_high_byte = false;
  for (int64_t row = 0; row < 200; ++row) {
    const std::vector<int64_t> ids = Sample(**source, 0, row, 256);
    std::string window;
    for (int64_t id : ids) {
      ASSERT_GE(id, 0);
      ASSERT_LT(id, 256);
      saw_high_byte |= id >= 128;
      window.push_back(static_cast<char>(id));
    }
    EXPECT_NE(text.find(window), absl::string_view::npos) << "row " << row;
    EXPECT_EQ(DecodeBytes(ids), window);
  }
  // The text has UTF-8 letters (æ); bytes >= 128 are ids >= 128, not negative.
  EXPECT_TRUE(saw_high_byte);
}

TEST(ByteTextTest, ExactBytesOfASmallText) {
  const std::string text = "ab\xc3\xa6z";  // "abæz"
  auto source = ByteTextSource::FromString(text, 0, "tiny");
  ASSERT_TRUE(source.ok());
  // A window as long as the text is the whole text.
  EXPECT_EQ(Sample(**source, 9, 4, 5), (std::vector<int64_t>{97, 98, 0xc3, 0xa6, 122}));
  EXPECT_EQ((*source)->Describe(), "bytes of tiny (5 bytes)");
}

TEST(ByteTextTest, SliceSamplesOnlyItsBytes) {
  // 0123456789 repeated: a window's bytes tell where it came from.
  std::string text;
  for (int i = 0; i < 100; ++i) text.push_back(static_cast<char>('0' + i % 10));
  auto source = ByteTextSource::FromString(text, 3, "digits");
  ASSERT_TRUE(source.ok());
  auto tail = (*source)->Slice(90, 100, 4);
  ASSERT_TRUE(tail.ok()) << tail.status();
  EXPECT_EQ((*tail)->max_sequence_length(), 10);
  EXPECT_EQ((*tail)->Describe(), "bytes [90, 100) of digits (10 bytes)");
  // The content digest is the whole text's, a slice's too.
  const std::string content = ContentDigest(text);
  EXPECT_EQ((*tail)->Fingerprint(),
            "byte_text(bytes=10,range=[90, 100),content=" + content + ",seed=4)");
  EXPECT_EQ((*source)->Fingerprint(), "byte_text(bytes=100,content=" + content + ",seed=3)");
  // Another text of the same size: another fingerprint.
  std::string other = text;
  other[50] = 'x';
  auto changed = ByteTextSource::FromString(other, 3, "digits");
  ASSERT_TRUE(changed.ok());
  EXPECT_NE((*changed)->Fingerprint(), (*source)->Fingerprint());
  EXPECT_EQ(Sample(**tail, 0, 0, 10),
            (std::vector<int64_t>{48, 49, 50, 51, 52, 53, 54, 55, 56, 57}));
  // The head [0, 90) never reaches the tail: windows of 85 start in [0, 5].
  auto head = (*source)->Slice(0, 90, 3);
  ASSERT_TRUE(head.ok());
  for (int64_t row = 0; row < 40; ++row) {
    const std::vector<int64_t> w = Sample(**head, 1, row, 85);
    EXPECT_LE(w[0] - '0', 5) << "row " << row;
  }
  // A slice of a slice counts from the text's start in its name.
  auto inner = (*tail)->Slice(2, 5, 4);
  ASSERT_TRUE(inner.ok());
  EXPECT_EQ((*inner)->Describe(), "bytes [92, 95) of digits (3 bytes)");
  EXPECT_EQ(Sample(**inner, 0, 0, 3), (std::vector<int64_t>{50, 51, 52}));
  auto bad = (*source)->Slice(50, 101, 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "token range [50, 101) is not a non-empty part of [0, 100)");
}

TEST(ByteTextTest, DeterministicPerStepRowAndSeed) {
  auto a = ByteTextSource::OpenDefault(1);
  auto b = ByteTextSource::OpenDefault(2);
  ASSERT_TRUE(a.ok() && b.ok());
  const auto x = Sample(**a, 4, 2, 64);
  EXPECT_EQ(x, Sample(**a, 4, 2, 64));
  EXPECT_NE(x, Sample(**a, 4, 3, 64));
  EXPECT_NE(x, Sample(**a, 5, 2, 64));
  EXPECT_NE(x, Sample(**b, 4, 2, 64));
}

TEST(ByteTextTest, DecodeWritesOtherIdsInBrackets) {
  EXPECT_EQ(DecodeBytes({72, 105, 300, -100, 33}), "Hi<300><-100>!");
  EXPECT_EQ(DecodeBytes({}), "");
}

TEST(ByteTextTest, OpensAFile) {
  const std::string path = TempPath("hello.txt");
  std::ofstream(path, std::ios::binary) << "hello, world";
  auto source = ByteTextSource::Open(path, 0);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ((*source)->text(), "hello, world");
}

TEST(ByteTextTest, MissingAndEmptyFilesAreClearErrors) {
  const std::string missing = TempPath("missing.txt");
  auto a = ByteTextSource::Open(missing, 0);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(a.status().message().find("cannot open " + missing), absl::string_view::npos)
      << a.status();

  const std::string empty = TempPath("empty.txt");
  std::ofstream(empty, std::ios::binary).flush();
  auto b = ByteTextSource::Open(empty, 0);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("text file " + empty + " is empty"), absl::string_view::npos)
      << b.status();
  EXPECT_FALSE(ByteTextSource::FromString("", 0).ok());
}

}  // namespace
}  // namespace data
