// Token files: both layouts written here and read back, auto-detection,
// windows that match the file, and a clear error for each kind of bad file.
#include "models/data/token_file.h"

#include <cstdlib>
#include <filesystem>
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

std::string ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), bytes.size());
}

std::string Int32Le(int32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i)
    s[i] = static_cast<char>((static_cast<uint32_t>(v) >> (8 * i)) & 0xff);
  return s;
}

// An llm.c header by hand (not through WriteTokenFile).
std::string LlmcHeader(int32_t magic, int32_t version, int32_t count) {
  std::string h = Int32Le(magic) + Int32Le(version) + Int32Le(count);
  h.resize(1024, '\0');
  return h;
}

std::string Uint16Le(const std::vector<int>& tokens) {
  std::string s;
  for (int t : tokens) {
    s.push_back(static_cast<char>(t & 0xff));
    s.push_back(static_cast<char>(t >> 8));
  }
  return s;
}

std::vector<int64_t> Tokens(int n) {
  std::vector<int64_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 7919) % 50257;
  return t;
}

std::string ErrorOf(const std::string& path, int64_t vocab = 50257,
                    TokenFileFormat format = TokenFileFormat::kAuto) {
  auto f = TokenFile::Open(path, vocab, format);
  EXPECT_FALSE(f.ok()) << path;
  if (f.ok()) return "";
  EXPECT_NE(f.status().message().find(path), absl::string_view::npos) << f.status();
  return std::string(f.status().message());
}

TEST(TokenFileTest, RawFileRoundTrip) {
  const std::string path = TempPath("raw.bin");
  const std::vector<int64_t> tokens = Tokens(1000);
  ASSERT_TRUE(WriteTokenFile(path, tokens, TokenFileFormat::kRaw).ok());
  EXPECT_EQ(ReadBytes(path).size(), 2000u);
  // Little-endian uint16: the second token 7919 = 0x1eef.
  EXPECT_EQ(ReadBytes(path).substr(2, 2), std::string("\xef\x1e"));
  auto file = TokenFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->format(), TokenFileFormat::kRaw);
  ASSERT_EQ((*file)->num_tokens(), 1000);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ((*file)->token(i), tokens[i]) << i;
}

TEST(TokenFileTest, LlmcFileRoundTripAndLayout) {
  const std::string path = TempPath("llmc.bin");
  const std::vector<int64_t> tokens = Tokens(777);
  ASSERT_TRUE(WriteTokenFile(path, tokens, TokenFileFormat::kLlmc).ok());
  const std::string bytes = ReadBytes(path);
  ASSERT_EQ(bytes.size(), 1024u + 2 * 777);
  EXPECT_EQ(bytes.substr(0, 12), Int32Le(20240520) + Int32Le(1) + Int32Le(777));
  EXPECT_EQ(bytes.substr(12, 1012), std::string(1012, '\0'));
  for (TokenFileFormat format : {TokenFileFormat::kAuto, TokenFileFormat::kLlmc}) {
    auto file = TokenFile::Open(path, 50257, format);
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ((*file)->format(), TokenFileFormat::kLlmc);
    ASSERT_EQ((*file)->num_tokens(), 777);
    std::vector<int64_t> all(777);
    (*file)->Read(0, absl::MakeSpan(all));
    EXPECT_EQ(all, tokens);
  }
}

TEST(TokenFileTest, HandWrittenFilesOfBothLayouts) {
  const std::string raw = TempPath("hand_raw.bin");
  WriteBytes(raw, Uint16Le({1, 258, 65535}));
  auto a = TokenFile::Open(raw, 65536);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->num_tokens(), 3);
  EXPECT_EQ((*a)->token(1), 258);
  EXPECT_EQ((*a)->token(2), 65535);

  const std::string llmc = TempPath("hand_llmc.bin");
  WriteBytes(llmc, LlmcHeader(20240520, 1, 2) + Uint16Le({50256, 11}));
  auto b = TokenFile::Open(llmc);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->format(), TokenFileFormat::kLlmc);
  EXPECT_EQ((*b)->token(0), 50256);
  EXPECT_EQ((*b)->token(1), 11);
}

TEST(TokenFileTest, SourceWindowsAreRunsOfTheFile) {
  const std::string path = TempPath("source.bin");
  std::vector<int64_t> tokens(5000);
  for (int i = 0; i < 5000; ++i) tokens[i] = i % 4000;  // consecutive runs
  ASSERT_TRUE(WriteTokenFile(path, tokens, TokenFileFormat::kLlmc).ok());
  auto source = TokenFileSource::Open(path, 11);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ((*source)->vocab_size(), 50257);
  EXPECT_EQ((*source)->max_sequence_length(), 5000);
  std::vector<int64_t> window(33);
  for (int64_t row = 0; row < 50; ++row) {
    (*source)->SampleSequence(2, row, absl::MakeSpan(window));
    // Find the window's start from its first token; all of it must match.
    bool found = false;
    for (int64_t s = 0; s + 33 <= 5000 && !found; ++s) {
      found = std::equal(window.begin(), window.end(), tokens.begin() + s);
    }
    EXPECT_TRUE(found) << "row " << row;
  }
  EXPECT_NE((*source)->Describe().find("llm.c, 5000 tokens, vocab 50257"), std::string::npos)
      << (*source)->Describe();
}

TEST(TokenFileTest, SliceSamplesOnlyItsTokens) {
  const std::string path = TempPath("slice.bin");
  ASSERT_TRUE(WriteTokenFile(path, Tokens(1000), TokenFileFormat::kRaw).ok());
  auto source = TokenFileSource::Open(path, 1);
  ASSERT_TRUE(source.ok()) << source.status();
  auto tail = (*source)->Slice(900, 1000, 2);
  ASSERT_TRUE(tail.ok()) << tail.status();
  EXPECT_EQ((*tail)->max_sequence_length(), 100);
  EXPECT_NE((*tail)->Describe().find("tokens [900, 1000) of "), std::string::npos)
      << (*tail)->Describe();
  EXPECT_NE((*tail)->Describe().find("raw uint16, 100 tokens"), std::string::npos);
  const std::string content = (*source)->file().content();
  EXPECT_EQ(content.size(), 16u);
  EXPECT_EQ((*tail)->Fingerprint(), "token_file(tokens=100,range=[900, 1000),vocab=50257,content=" +
                                        content + ",seed=2)");
  EXPECT_EQ((*source)->Fingerprint(),
            "token_file(tokens=1000,vocab=50257,content=" + content + ",seed=1)");
  // Another file of the same size: another content digest.
  std::vector<int64_t> changed = Tokens(1000);
  changed[500] = (changed[500] + 1) % 50257;
  const std::string other_path = TempPath("slice_other.bin");
  ASSERT_TRUE(WriteTokenFile(other_path, changed, TokenFileFormat::kRaw).ok());
  auto other = TokenFileSource::Open(other_path, 1);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE((*other)->file().content(), content);
  const std::vector<int64_t> all = Tokens(1000);
  std::vector<int64_t> window(20);
  for (int64_t row = 0; row < 30; ++row) {
    (*tail)->SampleSequence(0, row, absl::MakeSpan(window));
    bool found = false;
    for (int64_t s = 900; s + 20 <= 1000 && !found; ++s) {
      found = std::equal(window.begin(), window.end(), all.begin() + s);
    }
    EXPECT_TRUE(found) << "row " << row << " left [900, 1000)";
  }
  auto inner = (*tail)->Slice(10, 30, 2);
  ASSERT_TRUE(inner.ok());
  EXPECT_NE((*inner)->Describe().find("tokens [910, 930) of "), std::string::npos);
  EXPECT_FALSE((*source)->Slice(0, 0, 1).ok());
}

TEST(TokenFileTest, TruncatedLlmcFile) {
  const std::string path = TempPath("truncated.bin");
  ASSERT_TRUE(WriteTokenFile(path, Tokens(100), TokenFileFormat::kLlmc).ok());
  const std::string bytes = ReadBytes(path);
  WriteBytes(path, bytes.substr(0, bytes.size() - 3));
  EXPECT_NE(ErrorOf(path).find("truncated: the header says 100 tokens (200 bytes) but only 197 "
                               "bytes follow the 1024-byte header"),
            std::string::npos)
      << ErrorOf(path);
}

TEST(TokenFileTest, TrailingBytesAfterTheAnnouncedTokens) {
  const std::string path = TempPath("trailing.bin");
  WriteBytes(path, LlmcHeader(20240520, 1, 2) + Uint16Le({1, 2, 3}));
  EXPECT_NE(ErrorOf(path).find("2 trailing bytes after the 2 tokens"), std::string::npos)
      << ErrorOf(path);
}

TEST(TokenFileTest, BadMagicWhenLlmcIsRequired) {
  const std::string path = TempPath("bad_magic.bin");
  WriteBytes(path, LlmcHeader(12345, 1, 2) + Uint16Le({1, 2}));
  EXPECT_NE(ErrorOf(path, 50257, TokenFileFormat::kLlmc)
                .find("bad magic 12345 in the llm.c header (expected 20240520)"),
            std::string::npos);
}

TEST(TokenFileTest, UnsupportedVersionAndUint32Files) {
  const std::string v2 = TempPath("version2.bin");
  WriteBytes(v2, LlmcHeader(20240520, 2, 2) + Uint16Le({1, 2}));
  EXPECT_NE(ErrorOf(v2).find("unsupported llm.c header version 2 (expected 1"), std::string::npos)
      << ErrorOf(v2);
  const std::string u32 = TempPath("uint32.bin");
  WriteBytes(u32, LlmcHeader(20240801, 7, 1) + Int32Le(5));
  EXPECT_NE(ErrorOf(u32).find("uint32 tokens (magic 20240801)"), std::string::npos) << ErrorOf(u32);
}

// Raw uint32 ids (np.array(ids, np.uint32).tofile without .bin.json) would
// read as twice the tokens, every second one id 0: refused, naming what it
// looks like. A short such file (under 64 pairs) and a file of zeros are
// taken; one id 0 every second token in real text is not a thing.
TEST(TokenFileTest, RawUint32IdsAreRefused) {
  const std::string u32 = TempPath("u32raw.bin");
  std::string bytes;
  for (int i = 0; i < 4096; ++i) bytes += Int32Le(i % 50000 + 1);
  WriteBytes(u32, bytes);
  EXPECT_NE(ErrorOf(u32).find("every second uint16 of its first 2048 is 0: it looks like "
                              "uint32 tokens"),
            std::string::npos)
      << ErrorOf(u32);
  std::vector<int> ids(4096, 0);
  for (int i = 0; i < 4096; ++i) ids[i] = i % 2 == 0 ? i % 50000 + 1 : 0;
  ids[2047] = 7;  // one second uint16 that is not 0, within the first 2048
  WriteBytes(u32, Uint16Le(ids));
  EXPECT_TRUE(TokenFile::Open(u32, 50257).ok());
  WriteBytes(u32, Uint16Le(std::vector<int>(4096, 0)));
  EXPECT_TRUE(TokenFile::Open(u32, 50257).ok());
  bytes.clear();
  for (int i = 0; i < 63; ++i) bytes += Int32Le(i + 1);
  WriteBytes(u32, bytes);
  EXPECT_TRUE(TokenFile::Open(u32, 50257).ok());
}

TEST(TokenFileTest, TooSmallFiles) {
  const std::string header_only = TempPath("short_header.bin");
  WriteBytes(header_only, LlmcHeader(20240520, 1, 10).substr(0, 100));
  EXPECT_NE(ErrorOf(header_only).find("too small for the llm.c header: 100 bytes"),
            std::string::npos)
      << ErrorOf(header_only);

  const std::string empty = TempPath("empty.bin");
  WriteBytes(empty, "");
  EXPECT_NE(ErrorOf(empty).find("the file is empty"), std::string::npos);

  const std::string no_tokens = TempPath("no_tokens.bin");
  WriteBytes(no_tokens, LlmcHeader(20240520, 1, 0));
  EXPECT_NE(ErrorOf(no_tokens).find("holds no tokens"), std::string::npos);

  const std::string odd = TempPath("odd.bin");
  WriteBytes(odd, Uint16Le({1, 2}) + "x");
  EXPECT_NE(ErrorOf(odd).find("odd number of bytes (5)"), std::string::npos) << ErrorOf(odd);
}

TEST(TokenFileTest, TokenOutsideTheVocabularyNamesItsPosition) {
  const std::string path = TempPath("out_of_vocab.bin");
  std::vector<int64_t> tokens = Tokens(50);
  tokens[37] = 50300;
  ASSERT_TRUE(WriteTokenFile(path, tokens, TokenFileFormat::kLlmc).ok());
  EXPECT_NE(ErrorOf(path).find("token 50300 at position 37 is out of range (>= vocab_size 50257)"),
            std::string::npos)
      << ErrorOf(path);
  // With a larger vocabulary the same file is fine.
  EXPECT_TRUE(TokenFile::Open(path, 65536).ok());
  // A small vocabulary catches the first offender.
  EXPECT_NE(ErrorOf(path, 5000).find("at position 1 "), std::string::npos) << ErrorOf(path, 5000);
}

TEST(TokenFileTest, MissingFileIsNotFound) {
  const std::string path = TempPath("absent.bin");
  auto f = TokenFileSource::Open(path, 0);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(f.status().message().find(path), absl::string_view::npos);
}

TEST(TokenFileTest, WriteRefusesNonUint16Tokens) {
  const std::string path = TempPath("bad_write.bin");
  auto s = WriteTokenFile(path, {1, 70000}, TokenFileFormat::kRaw);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("token 70000 at position 1 is not a uint16"), absl::string_view::npos)
      << s;
}

TEST(TokenFileTest, WriterAppendsInPartsAndPublishesOnFinish) {
  for (TokenFileFormat format : {TokenFileFormat::kRaw, TokenFileFormat::kLlmc}) {
    const std::string path =
        TempPath(format == TokenFileFormat::kRaw ? "parts_raw.bin" : "parts_llmc.bin");
    auto writer = TokenFileWriter::Create(path, format);
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->Append({1, 2, 3}).ok());
    ASSERT_TRUE((*writer)->Append({}).ok());
    ASSERT_TRUE((*writer)->Append({50256, 65535}).ok());
    // A bad token is refused, naming its position in the file; the call
    // writes nothing.
    absl::Status bad = (*writer)->Append({7, -1});
    EXPECT_NE(bad.message().find("token -1 at position 6 is not a uint16"), absl::string_view::npos)
        << bad;
    EXPECT_EQ((*writer)->num_tokens(), 5);
    EXPECT_FALSE(std::filesystem::exists(path)) << "published before Finish";
    ASSERT_TRUE((*writer)->Finish().ok());
    EXPECT_FALSE((*writer)->Finish().ok());
    EXPECT_FALSE((*writer)->Append({1}).ok());
    auto f = TokenFile::Open(path, 65536);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ((*f)->format(), format);
    std::vector<int64_t> back(5);
    (*f)->Read(0, absl::MakeSpan(back));
    EXPECT_EQ(back, (std::vector<int64_t>{1, 2, 3, 50256, 65535}));
  }
  // An unfinished writer leaves nothing behind.
  const std::string path = TempPath("unfinished.bin");
  {
    auto writer = TokenFileWriter::Create(path, TokenFileFormat::kLlmc);
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE((*writer)->Append({1, 2}).ok());
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  for (const auto& entry : std::filesystem::directory_iterator(TempPath(""))) {
    EXPECT_NE(entry.path().filename().string().rfind("unfinished.bin", 0), 0u) << entry.path();
  }
}

// Two writers of one path (two tokenize runs to one --output) each write
// their own temporary file, so each Finish publishes a whole file: the last
// one's. (With one shared OUT.tmp, the second writer's creation cut the
// first's bytes, the first Finish published a mix and the second found no
// file to rename.)
TEST(TokenFileTest, TwoWritersOfOnePathEachPublishAWholeFile) {
  const std::string path = TempPath("two_writers.bin");
  auto first = TokenFileWriter::Create(path, TokenFileFormat::kLlmc);
  auto second = TokenFileWriter::Create(path, TokenFileFormat::kLlmc);
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_TRUE((*first)->Append({1, 2, 3, 4}).ok());
  ASSERT_TRUE((*second)->Append({9, 8}).ok());
  ASSERT_TRUE((*first)->Append({5}).ok());
  ASSERT_TRUE((*first)->Finish().ok());
  auto read_back = [&]() {
    auto f = TokenFile::Open(path, 65536);
    EXPECT_TRUE(f.ok()) << f.status();
    if (!f.ok()) return std::vector<int64_t>{};
    std::vector<int64_t> tokens((*f)->num_tokens());
    (*f)->Read(0, absl::MakeSpan(tokens));
    return tokens;
  };
  EXPECT_EQ(read_back(), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  ASSERT_TRUE((*second)->Append({7}).ok());
  absl::Status second_finish = (*second)->Finish();
  ASSERT_TRUE(second_finish.ok()) << second_finish;
  EXPECT_EQ(read_back(), (std::vector<int64_t>{9, 8, 7}));
}

TEST(TokenFileTest, MetaRoundTripAndBadRecordsNameTheFile) {
  const std::string path = TempPath("meta.bin");
  std::filesystem::remove(TokenFileMetaPath(path));
  absl::StatusOr<std::optional<TokenFileMeta>> none = ReadTokenFileMeta(path);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->has_value());
  ASSERT_TRUE(WriteTokenFileMeta(path, {"/data/my \"tok\"", 50257, 147297}).ok());
  EXPECT_EQ(TokenFileMetaPath(path), path + ".json");
  absl::StatusOr<std::optional<TokenFileMeta>> meta = ReadTokenFileMeta(path);
  ASSERT_TRUE(meta.ok() && meta->has_value()) << meta.status();
  EXPECT_EQ((*meta)->tokenizer, "/data/my \"tok\"");
  EXPECT_EQ((*meta)->vocab_size, 50257);
  EXPECT_EQ((*meta)->num_tokens, 147297);
  for (const auto& [text, what] : std::vector<std::pair<std::string, std::string>>{
           {"[1]", "not a JSON object"},
           {"{\"vocab_size\": 5, \"num_tokens\": 2}", "no 'tokenizer' string"},
           {"{\"tokenizer\": \"gpt2\", \"num_tokens\": 2}", "no 'vocab_size' integer >= 1"},
           {"{\"tokenizer\": \"gpt2\", \"vocab_size\": 5, \"num_tokens\": 0}",
            "no 'num_tokens' integer >= 1"},
           {"{\"tokenizer\": ", "bad JSON"}}) {
    std::ofstream(TokenFileMetaPath(path), std::ios::trunc) << text;
    absl::StatusOr<std::optional<TokenFileMeta>> bad = ReadTokenFileMeta(path);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(bad.status().message().find(path + ".json (what made " + path + "): " + what),
              std::string::npos)
        << bad.status();
  }
  // A record that cannot be read is an error, not a file without a record.
  std::filesystem::remove(TokenFileMetaPath(path));
  std::filesystem::create_directory(TokenFileMetaPath(path));
  absl::StatusOr<std::optional<TokenFileMeta>> unread = ReadTokenFileMeta(path);
  EXPECT_EQ(unread.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(unread.status().message(),
            path + ".json (what made " + path + "): " + path + ".json: is a folder, not a file");
  std::filesystem::remove(TokenFileMetaPath(path));
}

}  // namespace
}  // namespace data
