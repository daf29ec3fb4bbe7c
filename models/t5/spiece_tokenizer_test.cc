// The C++ T5 tokenizer (libsentencepiece) against tools/spm_tokenize.py
// (python3-sentencepiece) on a model trained at build time
// (testdata/spiece_goldens.py): the same ids for plain text, whitespace,
// NFKC forms, unknown characters and sentinels, and the same text for ids
// with control pieces and sentinels between runs. Sentinels it does not have
// are refused, naming them; rows above the sentinels decode as <id_N>.
#include "models/t5/spiece_tokenizer.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
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
  EXPECT_EQ(tokenizer_->Decode({400, 31999, -3}), "<id_400><id_31999><id_-3>");
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
