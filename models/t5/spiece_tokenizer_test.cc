// The C++ T5 tokenizer (libsentencepiece) against tools/spm_tokenize.py
// (python3-sentencepiece) on a model trained at build time
// (testdata/spiece_goldens.py): the same ids for plain text, whitespace,
// NFKC forms, unknown characters and sentinels, and the same text for ids
// with control pieces and sentinels between runs. Sentinels it does not have
// are refused, naming them, and so is text that is not UTF-8; rows above the
// sentinels decode as <|id N|>.
#include "models/t5/spiece_tokenizer.h"

#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "gtest/gtest.h"
#include "models/data/runfiles.h"
#include "models/t5/spiece_files.h"
#include "tensor/json.h"

namespace t5 {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Runfile(const std::string& path) {
  absl::StatusOr<std::string> resolved = data::ResolveRunfile(path);
  EXPECT_TRUE(resolved.ok()) << resolved.status();
  return resolved.ok() ? *resolved : "";
}

int64_t Int(const tensor::Json& j) {
  int64_t v = 0;
  EXPECT_TRUE(absl::SimpleAtoi(j.text, &v)) << j.text;
  return v;
}

std::vector<int64_t> Ids(const tensor::Json& j) {
  std::vector<int64_t> ids;
  for (const tensor::Json& item : j.items) ids.push_back(Int(item));
  return ids;
}

class SpieceTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<SentencePieceModel> model =
        ReadSentencePieceModel(Runfile("models/t5/spiece_test.model"));
    ASSERT_TRUE(model.ok()) << model.status();
    absl::StatusOr<tensor::Json> goldens =
        tensor::ParseJson(ReadFile(Runfile("models/t5/spiece_goldens.json")));
    ASSERT_TRUE(goldens.ok()) << goldens.status();
    goldens_ = *goldens;
    absl::StatusOr<SpieceTokenizer> tokenizer =
        SpieceTokenizer::Load(*model, Int(*goldens_.Get("sentinels")));
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = std::make_unique<SpieceTokenizer>(*std::move(tokenizer));
  }

  tensor::Json goldens_;
  std::unique_ptr<SpieceTokenizer> tokenizer_;
};

TEST_F(SpieceTokenizerTest, KnowsTheModelsPiecesAndEos) {
  EXPECT_EQ(tokenizer_->pieces(), Int(*goldens_.Get("pieces")));
  EXPECT_EQ(tokenizer_->pieces(), 300);
  EXPECT_EQ(tokenizer_->sentinels(), 100);
  EXPECT_EQ(tokenizer_->eos_id(), Int(*goldens_.Get("eos_id")));
  EXPECT_TRUE(absl::EndsWith(tokenizer_->path(), "spiece_test.model"));
}

TEST_F(SpieceTokenizerTest, EncodesAsThePythonToolDoes) {
  const std::vector<tensor::Json>& cases = goldens_.Get("encode")->items;
  ASSERT_EQ(cases.size(), 9u);
  for (const tensor::Json& c : cases) {
    absl::StatusOr<std::vector<int64_t>> ids = tokenizer_->Encode(c.items[0].text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, Ids(c.items[1])) << "'" << c.items[0].text << "'";
  }
}

TEST_F(SpieceTokenizerTest, TokenFileTextTakesSentinelsAsText) {
  const std::vector<tensor::Json>& cases = goldens_.Get("plain")->items;
  ASSERT_EQ(cases.size(), 9u);
  for (const tensor::Json& c : cases) {
    absl::StatusOr<std::vector<int64_t>> ids =
        tokenizer_->Encode(c.items[0].text, /*read_sentinels=*/false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, Ids(c.items[1])) << "'" << c.items[0].text << "'";
  }
  // Even one no sentinel is (it would be refused when read).
  EXPECT_TRUE(tokenizer_->Encode("<extra_id_100>", /*read_sentinels=*/false).ok());
}

TEST_F(SpieceTokenizerTest, DecodesAsThePythonToolDoes) {
  const std::vector<tensor::Json>& cases = goldens_.Get("decode")->items;
  ASSERT_EQ(cases.size(), 30u);
  for (const tensor::Json& c : cases) {
    EXPECT_EQ(tokenizer_->Decode(Ids(c.items[0])), c.items[1].text);
  }
}

TEST_F(SpieceTokenizerTest, SentinelsAndRowsAboveThem) {
  // <extra_id_0> is the highest sentinel id, 399; the space after it is the
  // text's own.
  absl::StatusOr<std::vector<int64_t>> ids = tokenizer_->Encode("<extra_id_0> of prisms");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->front(), 399);
  EXPECT_EQ(tokenizer_->Decode(*ids), "<extra_id_0> of prisms");
  EXPECT_EQ(tokenizer_->Decode({399, 300}), "<extra_id_0><extra_id_99>");
  // A padded vocabulary's rows, and what is no id, are named.
  EXPECT_EQ(tokenizer_->Decode({400, 31999, -3}), "<|id 400|><|id 31999|><|id -3|>");
  for (const char* text : {"a <extra_id_100> b", "<extra_id_123456789012345678901234>"}) {
    absl::StatusOr<std::vector<int64_t>> bad = tokenizer_->Encode(text);
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(bad.status().message(),
                                  "is not one of the 100 sentinels (<extra_id_0> .. "
                                  "<extra_id_99>)"))
        << bad.status();
    EXPECT_TRUE(absl::StrContains(bad.status().message(), "'<extra_id_1")) << bad.status();
  }
}

TEST_F(SpieceTokenizerTest, TextThatIsNotUtf8IsRefusedNamingTheByte) {
  // Well-formed: 2-, 3- and 4-byte characters, the edges of their ranges.
  for (const char* good : {"caf\xc3\xa9", "\xe2\x98\x83", "\xf0\x9f\x98\x80", "\xed\x9f\xbf",
                           "\xf4\x8f\xbf\xbf", "\xe0\xa0\x80"}) {
    EXPECT_TRUE(tokenizer_->Encode(good).ok()) << good;
  }
  // A stray continuation byte, a cut character, overlong forms, a surrogate,
  // above U+10FFFF, bytes no character begins with.
  for (const auto& [bad, byte] : std::vector<std::pair<std::string, int>>{
           {"ab\x80", 3}, {"a\xc3", 2}, {"\xe2\x98", 1}, {"x\xc0\xaf", 2},
           {"\xe0\x9f\xbf", 1}, {"\xed\xa0\x80", 1}, {"\xf4\x90\x80\x80", 1},
           {"ok \xff", 4}, {"\xf8\x88\x80\x80\x80", 1}, {"\xc3(", 1}}) {
    absl::StatusOr<std::vector<int64_t>> ids = tokenizer_->Encode(bad);
    ASSERT_FALSE(ids.ok()) << bad;
    EXPECT_EQ(ids.status().message(), absl::StrCat("it is not UTF-8 text (byte ", byte,
                                                   " does not begin a character)"));
  }
}

// Parts end as tools/spm_tokenize.py's parts() ends them: at the first '\n'
// at or past character 2^20 (characters, not bytes; "\r" is one).
TEST(SentencePiecePartEnd, AtTheFirstLineEndPast2To20Characters) {
  const size_t k = kSentencePiecePartChars;
  EXPECT_EQ(SentencePiecePartEnd(""), 0u);
  EXPECT_EQ(SentencePiecePartEnd("short\ntext\n"), 11u);
  EXPECT_EQ(SentencePiecePartEnd(std::string(k, 'a')), k);  // no line end: all of it
  EXPECT_EQ(SentencePiecePartEnd(std::string(k + 5, 'a')), k + 5);
  // A line end at character 2^20 ends the part; one before it does not.
  std::string text = std::string(k, 'a') + "\nbc\n";
  EXPECT_EQ(SentencePiecePartEnd(text), k + 1);
  text = "ab\n" + std::string(k, 'a') + "\nbc";
  EXPECT_EQ(SentencePiecePartEnd(text), k + 4);
  // 2^20 - 1 two-byte characters, a line end (character 2^20 - 1), then
  // character 2^20: the part runs to the next line end. Counting bytes would
  // stop at the first.
  text = "";
  for (size_t i = 0; i + 1 < k; ++i) text += "\xc3\xa9";
  const size_t first_line_end = text.size();
  text += "\nxxxxxxxxxx\nrest";
  EXPECT_EQ(SentencePiecePartEnd(text), first_line_end + 12);
  // "\r" is a character: CRLF lines end where Python's (newline="") end.
  text = std::string(k - 1, 'a') + "\r\nb\r\n";
  EXPECT_EQ(SentencePiecePartEnd(text), k + 1);
}

TEST(SpieceTokenizer, ZeroSentinelsSaySo) {
  absl::StatusOr<SentencePieceModel> model =
      ReadSentencePieceModel(Runfile("models/t5/spiece_test.model"));
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<SpieceTokenizer> tokenizer = SpieceTokenizer::Load(*model, 0);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(tokenizer->Encode("of <extra_id_0>").status().message(),
            "'<extra_id_0>' is a sentinel, and there are none");
  EXPECT_EQ(tokenizer->Decode({300}), "<|id 300|>");
  // A model whose protobuf the library reads otherwise than ParseSentencePieces.
  model->pieces.texts.pop_back();
  EXPECT_TRUE(absl::StrContains(SpieceTokenizer::Load(*model, 0).status().message(),
                                "SentencePiece loads 300 pieces of it, not the 299 its protobuf "
                                "holds"));
}

TEST(SpieceTokenizer, RefusesWhatDoesNotLoad) {
  SentencePieceModel model;
  model.path = "/some/spiece.model";
  model.bytes = "not a model";
  absl::StatusOr<SpieceTokenizer> bad = SpieceTokenizer::Load(model, 100);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(bad.status().message(),
                               "/some/spiece.model: SentencePiece does not load it: "))
      << bad.status();
  bad = SpieceTokenizer::Load(model, -1);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "-1 sentinels")) << bad.status();
}

}  // namespace
}  // namespace t5
