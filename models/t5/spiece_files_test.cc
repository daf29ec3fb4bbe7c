// SentencePiece model files: pieces read from the protobuf wire format of a
// hand-built model (pieces, a trainer spec), malformed files refused naming
// why, and the tokenizer_config.json export writes, naming the model's own
// special pieces.
#include "models/t5/spiece_files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace t5 {
namespace {

// A length-delimited field (its length a varint of one or two bytes).
std::string Field(int number, const std::string& payload) {
  std::string length(1, static_cast<char>(payload.size() & 0x7f));
  if (payload.size() >= 0x80) {
    length = std::string(1, static_cast<char>(0x80 | (payload.size() & 0x7f))) +
             std::string(1, static_cast<char>(payload.size() >> 7));
  }
  return std::string(1, static_cast<char>(number << 3 | 2)) + length + payload;
}

// A SentencePiece: text (1), score (2, a float), type (3, a varint: 1
// normal, 2 unknown, 3 control).
std::string Piece(const std::string& text, char type = 1) {
  return Field(1, Field(1, text) + std::string("\x15\x00\x00\x80\xbf", 5) + "\x18" + type);
}

// T5's special pieces (pad 0, </s> 1, unk 2), a trainer spec (field 2)
// holding a varint and a 64-bit field, and a piece of 200 bytes.
std::string Model() {
  return Piece("<pad>", 3) + Piece("</s>", 3) + Piece("<unk>", 2) +
         Field(2, std::string("\x08\x07\x11\x01\x02\x03\x04\x05\x06\x07\x08", 11)) +
         Piece("\xe2\x96\x81the") + Piece(std::string(200, 'x'));
}

TEST(SpieceFilesTest, ReadsThePiecesOfAModel) {
  absl::StatusOr<SentencePieces> m = ParseSentencePieces(Model());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->texts, (std::vector<std::string>{"<pad>", "</s>", "<unk>", "\xe2\x96\x81the",
                                                std::string(200, 'x')}));
  EXPECT_EQ(m->unk_id, 2);
}

TEST(SpieceFilesTest, AMalformedModelIsRefusedSayingWhy) {
  const std::string model = Model();
  auto message = [](absl::string_view bytes) {
    return std::string(ParseSentencePieces(bytes).status().message());
  };
  EXPECT_EQ(message(model.substr(0, model.size() - 2)), "a field runs past the end");
  EXPECT_EQ(message(""), "it holds no piece");
  EXPECT_EQ(message(Field(2, "x")), "it holds no piece");
  EXPECT_EQ(message("hello"), "field 13 has wire type 4, which a model has not");
  EXPECT_EQ(message(Field(1, "\x10\x01")), "piece 0 is not a SentencePiece (it has no text)");
  EXPECT_EQ(message(std::string("\x08\x01", 2)), "field 1 (a piece) is not a message");
  // A length of 2^32 - 1 bytes in a 20-byte file.
  EXPECT_EQ(message(std::string("\x0a\xff\xff\xff\xff\x0f", 6) + std::string(14, 'x')),
            "a field runs past the end");
}

TEST(SpieceFilesTest, ReadsAModelByFileFolderOrRecord) {
  const std::string dir = ::testing::TempDir();
  const std::string path = absl::StrCat(dir, "/spiece.model");
  std::ofstream(path, std::ios::binary) << Model();
  for (const std::string& spec : {path, dir, absl::StrCat("sentencepiece:", path)}) {
    absl::StatusOr<SentencePieceModel> m = ReadSentencePieceModel(spec);
    ASSERT_TRUE(m.ok()) << spec << ": " << m.status();
    EXPECT_EQ(m->path, path);
    EXPECT_EQ(m->pieces.texts.size(), 5u);
    EXPECT_EQ(m->bytes, Model());
  }
  const std::string text = absl::StrCat(dir, "/notes.txt");
  std::ofstream(text) << "hello";
  EXPECT_EQ(ReadSentencePieceModel(text).status().message(),
            absl::StrCat(text, " is not a SentencePiece model: field 13 has wire type 4, which a ",
                         "model has not"));
  EXPECT_EQ(ReadSentencePieceModel(dir + "/none").status().message(),
            absl::StrCat(dir, "/none: no such file (a SentencePiece model, spiece.model)"));
  const std::string empty = absl::StrCat(dir, "/empty.model");
  std::ofstream(empty).flush();
  EXPECT_EQ(ReadSentencePieceModel(empty).status().message(),
            absl::StrCat(empty, " is not a SentencePiece model: it holds no piece"));
}

TEST(SpieceFilesTest, ATokenizerConfigBesideTheModelGivesItsSentinels) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/with_config");
  ASSERT_TRUE(::mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST);
  std::ofstream(dir + "/spiece.model", std::ios::binary) << Model();
  ::unlink((dir + "/tokenizer_config.json").c_str());
  auto extra_ids = [&] {
    absl::StatusOr<SentencePieceModel> m = ReadSentencePieceModel(dir);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? m->extra_ids : -2;
  };
  EXPECT_EQ(extra_ids(), -1);  // no tokenizer_config.json
  std::ofstream(dir + "/tokenizer_config.json") << T5TokenizerConfigJson(
      *ParseSentencePieces(Model()), 7, /*pad_id=*/0, /*eos_id=*/1);
  EXPECT_EQ(extra_ids(), 7);
  std::ofstream(dir + "/tokenizer_config.json") << "{\"model_max_length\": 512}";
  EXPECT_EQ(extra_ids(), -1);  // it does not say
  for (const char* bad : {"{\"extra_ids\": -1}", "{\"extra_ids\": \"7\"}",
                          "{\"extra_ids\": 1.5}", "[7]", "{\"extra_ids\": "}) {
    std::ofstream(dir + "/tokenizer_config.json") << bad;
    absl::StatusOr<SentencePieceModel> m = ReadSentencePieceModel(dir);
    ASSERT_FALSE(m.ok()) << bad;
    EXPECT_TRUE(absl::StartsWith(
        m.status().message(),
        absl::StrCat(dir, "/tokenizer_config.json (beside ", dir,
                     "/spiece.model) is not a tokenizer configuration: ")))
        << m.status();
  }
  std::ofstream(dir + "/tokenizer_config.json") << "[7]";
  EXPECT_TRUE(absl::EndsWith(ReadSentencePieceModel(dir).status().message(),
                             "configuration: not a JSON object"));
  // One that cannot be read is an error too, not a configuration that says
  // nothing.
  ::unlink((dir + "/tokenizer_config.json").c_str());
  ASSERT_EQ(::mkdir((dir + "/tokenizer_config.json").c_str(), 0755), 0);
  EXPECT_EQ(ReadSentencePieceModel(dir).status().message(),
            absl::StrCat(dir, "/tokenizer_config.json: is a folder, not a file (the tokenizer "
                         "configuration beside ", dir, "/spiece.model)"));
  ::rmdir((dir + "/tokenizer_config.json").c_str());
  std::ofstream(dir + "/tokenizer_config.json") << "{\"extra_ids\": -1}";
  EXPECT_TRUE(absl::EndsWith(ReadSentencePieceModel(dir).status().message(),
                             "configuration: its extra_ids is not an integer >= 0"));
}

TEST(SpieceFilesTest, TheSentinelsComeFromTheDataThenTheConfigThenT5s) {
  SentencePieceModel model;
  model.path = "/m/spiece.model";
  model.pieces = *ParseSentencePieces(Model());  // 5 pieces
  EXPECT_EQ(*SentinelsOfTokenizer(model, "", "weights", 105), 100);  // T5's
  model.extra_ids = 7;
  EXPECT_EQ(*SentinelsOfTokenizer(model, "", "weights", 12), 7);
  // A checkpoint's data loader state says 3, over 5 ids.
  const std::string state =
      "step=10;span_corruption(token_file(tokens=36269,vocab=5,seed=1337),global_batch=4,"
      "S=64,T_dec=16,L=71,density=0.15,mean_span=3,sentinels=3,eos=1,pad=0,ignore=-100,"
      "start=0,seed=1337)";
  EXPECT_EQ(*SentinelsOfTokenizer(model, state, "weights", 8), 3);
  EXPECT_EQ(SentinelsOfTokenizer(model, state, "weights", 7).status().message(),
            "its 5 pieces and 3 sentinels do not fit the model's vocabulary of 7");
  EXPECT_EQ(SentinelsOfTokenizer(model, "", "weights", 11).status().message(),
            "its 5 pieces and 7 sentinels do not fit the model's vocabulary of 11");
  std::string other = state;
  other.replace(other.find("vocab=5"), 7, "vocab=6");
  EXPECT_EQ(SentinelsOfTokenizer(model, other, "checkpoint X", 100).status().message(),
            "/m/spiece.model has 5 pieces, but the data of checkpoint X had 6 ids: not the "
            "tokenizer it was encoded with");
}

TEST(SpieceFilesTest, TheTokenizerConfigGivesTheSentinelsAndTheModelsSpecialPieces) {
  const SentencePieces model = *ParseSentencePieces(Model());
  EXPECT_EQ(T5TokenizerConfigJson(model, 7, /*pad_id=*/0, /*eos_id=*/1),
            "{\n  \"tokenizer_class\": \"T5Tokenizer\",\n  \"extra_ids\": 7,\n"
            "  \"eos_token\": \"</s>\",\n  \"unk_token\": \"<unk>\",\n"
            "  \"pad_token\": \"<pad>\"\n}\n");
  // Another model's ids; no eos (-1): none named.
  const std::string json = T5TokenizerConfigJson(model, 100, /*pad_id=*/3, /*eos_id=*/-1);
  EXPECT_FALSE(absl::StrContains(json, "eos_token")) << json;
  EXPECT_TRUE(absl::StrContains(json, "\"pad_token\": \"\u2581the\"") ||
              absl::StrContains(json, "\"pad_token\": \"\xe2\x96\x81the\""))
      << json;
}

}  // namespace
}  // namespace t5
