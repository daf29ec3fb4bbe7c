// SentencePiece model files: pieces counted from the protobuf wire format of
// a hand-built model (three pieces, a trainer spec), malformed files refused
// naming why, and the tokenizer_config.json export writes.
#include "models/t5/spiece_files.h"

#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace t5 {
namespace {

// A length-delimited field.
std::string Field(int number, const std::string& payload) {
  return std::string(1, static_cast<char>(number << 3 | 2)) +
         std::string(1, static_cast<char>(payload.size())) + payload;
}

// A SentencePiece: text (1), score (2, a float), type (3, a varint).
std::string Piece(const std::string& text) {
  return Field(1, Field(1, text) + std::string("\x15\x00\x00\x80\xbf", 5) + "\x18\x01");
}

// Three pieces and a trainer spec (field 2) holding a varint.
std::string Model() {
  return Piece("<pad>") + Piece("</s>") + Field(2, std::string("\x08\x07", 2)) +
         Piece("\xe2\x96\x81the");
}

TEST(SpieceFilesTest, CountsThePiecesOfAModel) {
  absl::StatusOr<int64_t> n = CountSentencePieces(Model());
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 3);
}

TEST(SpieceFilesTest, AMalformedModelIsRefusedSayingWhy) {
  const std::string model = Model();
  auto message = [](absl::string_view bytes) {
    return std::string(CountSentencePieces(bytes).status().message());
  };
  EXPECT_EQ(message(model.substr(0, model.size() - 2)), "a field runs past the end");
  EXPECT_EQ(message(""), "it holds no piece");
  EXPECT_EQ(message(Field(2, "x")), "it holds no piece");
  EXPECT_EQ(message("hello"), "field 13 has wire type 4, which a model has not");
  EXPECT_EQ(message(Field(1, "\x10\x01")), "piece 0 is not a SentencePiece (it has no text)");
  EXPECT_EQ(message(std::string("\x08\x01", 2)), "field 1 (a piece) is not a message");
}

TEST(SpieceFilesTest, ReadsAModelByFileFolderOrRecord) {
  const std::string dir = ::testing::TempDir();
  const std::string path = absl::StrCat(dir, "/spiece.model");
  std::ofstream(path, std::ios::binary) << Model();
  for (const std::string& spec : {path, dir, absl::StrCat("sentencepiece:", path)}) {
    absl::StatusOr<SentencePieceModel> m = ReadSentencePieceModel(spec);
    ASSERT_TRUE(m.ok()) << spec << ": " << m.status();
    EXPECT_EQ(m->path, path);
    EXPECT_EQ(m->pieces, 3);
    EXPECT_EQ(m->bytes, Model());
  }
  const std::string text = absl::StrCat(dir, "/notes.txt");
  std::ofstream(text) << "hello";
  EXPECT_EQ(ReadSentencePieceModel(text).status().message(),
            absl::StrCat(text, " is not a SentencePiece model: field 13 has wire type 4, which a ",
                         "model has not"));
  EXPECT_TRUE(absl::StrContains(ReadSentencePieceModel(dir + "/none").status().message(),
                                "cannot read it"));
}

TEST(SpieceFilesTest, TheTokenizerConfigGivesTheSentinels) {
  const std::string json = T5TokenizerConfigJson(7);
  EXPECT_TRUE(absl::StrContains(json, "\"extra_ids\": 7")) << json;
  EXPECT_TRUE(absl::StrContains(json, "\"tokenizer_class\": \"T5Tokenizer\"")) << json;
}

}  // namespace
}  // namespace t5
