// Tests of GPT-2's BPE tokenizer: the shipped files, and ids equal to tiktoken's
// on the reference cases and the shipped text.
#include "models/data/gpt2_tokenizer.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/data/runfiles.h"
#include "tensor/json.h"

namespace data {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

const Gpt2Tokenizer& Gpt2() {
  static const Gpt2Tokenizer* tokenizer = [] {
    absl::StatusOr<Gpt2Tokenizer> t = Gpt2Tokenizer::Shipped();
    EXPECT_TRUE(t.ok()) << t.status();
    return new Gpt2Tokenizer(*std::move(t));
  }();
  return *tokenizer;
}

// testdata/gpt2_bpe_cases.json, written by tiktoken (gpt2_bpe_reference.js).
tensor::Json Reference() {
  absl::StatusOr<std::string> path = ResolveRunfile("models/data/testdata/gpt2_bpe_cases.json");
  EXPECT_TRUE(path.ok()) << path.status();
  absl::StatusOr<tensor::Json> json = tensor::ParseJson(ReadFile(*path));
  EXPECT_TRUE(json.ok()) << json.status();
  return *json;
}

std::vector<int64_t> Ids(const tensor::Json& array) {
  std::vector<int64_t> ids;
  for (const tensor::Json& item : array.items) {
    int64_t id = -1;
    EXPECT_TRUE(absl::SimpleAtoi(item.text, &id));
    ids.push_back(id);
  }
  return ids;
}

std::string Escaped(const std::string& text) { return tensor::JsonQuote(text); }

TEST(Gpt2TokenizerTest, TheShippedFilesAreGpt2s) {
  const Gpt2Tokenizer& t = Gpt2();
  EXPECT_EQ(t.vocab_size(), 50257);
  EXPECT_EQ(t.num_merges(), 50000);
  EXPECT_EQ(t.end_of_text(), 50256);
  EXPECT_THAT(t.Encode("Hello world"), ElementsAre(15496, 995));
}

TEST(Gpt2TokenizerTest, EncodesEveryReferenceCaseAsTiktokenDoes) {
  const tensor::Json reference = Reference();
  const tensor::Json* cases = reference.Get("cases");
  ASSERT_NE(cases, nullptr);
  ASSERT_GT(cases->items.size(), 400u);
  int mismatches = 0;
  for (const tensor::Json& c : cases->items) {
    const std::string& text = c.Get("text")->text;
    const std::vector<int64_t> want = Ids(*c.Get("ids"));
    const std::vector<int64_t> got = Gpt2().Encode(text);
    if (got != want && ++mismatches <= 5) {
      ADD_FAILURE() << "text " << Escaped(text) << "\n  ours:     " << absl::StrJoin(got, ",")
                    << "\n  tiktoken: " << absl::StrJoin(want, ",");
    }
    absl::StatusOr<std::string> back = Gpt2().Decode(want);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, text);
  }
  EXPECT_EQ(mismatches, 0) << "of " << cases->items.size() << " cases";
}

TEST(Gpt2TokenizerTest, EncodesSpecialTokensAsTiktokenDoes) {
  const tensor::Json reference = Reference();
  const tensor::Json* cases = reference.Get("special_cases");
  ASSERT_NE(cases, nullptr);
  ASSERT_GE(cases->items.size(), 7u);
  for (const tensor::Json& c : cases->items) {
    const std::string& text = c.Get("text")->text;
    EXPECT_EQ(Gpt2().EncodeWithSpecialTokens(text), Ids(*c.Get("ids"))) << Escaped(text);
    EXPECT_EQ(*Gpt2().Decode(Gpt2().EncodeWithSpecialTokens(text)), text);
  }
  // Without special tokens the marker is ordinary text ("<", "|", "end", ...).
  const std::vector<int64_t> ordinary = Gpt2().Encode("<|endoftext|>");
  EXPECT_GT(ordinary.size(), 1u);
  EXPECT_EQ(std::count(ordinary.begin(), ordinary.end(), 50256), 0);
}

TEST(Gpt2TokenizerTest, EncodesTheShippedTextAsTiktokenDoes) {
  const tensor::Json reference = Reference();
  const tensor::Json* shipped = reference.Get("shipped_text");
  ASSERT_NE(shipped, nullptr);
  absl::StatusOr<std::string> path = ResolveRunfile("models/data/text/newton_opticks.txt");
  ASSERT_TRUE(path.ok()) << path.status();
  const std::string text = ReadFile(*path);
  const std::vector<int64_t> ids = Gpt2().Encode(text);
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a 64 over the ids as little-endian uint32
  for (int64_t id : ids) {
    for (int b = 0; b < 4; ++b) {
      hash ^= (static_cast<uint64_t>(id) >> (8 * b)) & 0xff;
      hash *= 0x100000001b3ull;
    }
  }
  EXPECT_EQ(absl::StrCat(ids.size()), shipped->Get("num_tokens")->text);
  char hex[19];
  std::snprintf(hex, sizeof(hex), "0x%016llx", static_cast<unsigned long long>(hash));
  EXPECT_EQ(hex, shipped->Get("fnv1a64")->text);
  absl::StatusOr<std::string> back = Gpt2().Decode(ids);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(*back == text);
}

TEST(Gpt2TokenizerTest, EncodingInChunksGivesTheIdsOfTheWhole) {
  absl::StatusOr<std::string> path = ResolveRunfile("models/data/text/newton_opticks.txt");
  ASSERT_TRUE(path.ok());
  const std::string text = ReadFile(*path);
  const std::vector<int64_t> whole = Gpt2().Encode(text);
  for (size_t max_bytes : {size_t{64}, size_t{1000}, size_t{65536}}) {
    std::vector<int64_t> parts;
    int chunks = 0;
    for (absl::string_view rest = text; !rest.empty(); ++chunks) {
      const size_t end = Gpt2ChunkEnd(rest, max_bytes);
      ASSERT_GT(end, 0u);
      const std::vector<int64_t> ids = Gpt2().Encode(rest.substr(0, end));
      parts.insert(parts.end(), ids.begin(), ids.end());
      rest.remove_prefix(end);
    }
    EXPECT_GT(chunks, static_cast<int>(text.size() / max_bytes) / 2) << max_bytes;
    EXPECT_TRUE(parts == whole) << "chunks of at most about " << max_bytes << " bytes";
  }
  // The cut is "x\ny" only: not after a blank line or white space, and not
  // inside a run; text without one is one chunk.
  EXPECT_EQ(Gpt2ChunkEnd("ab\ncd", 10), 5u);
  EXPECT_EQ(Gpt2ChunkEnd("ab\ncd\nef", 6), 6u);
  EXPECT_EQ(Gpt2ChunkEnd("ab\ncd\nef", 5), 3u);
  EXPECT_EQ(Gpt2ChunkEnd("ab\n\ncd\n ef\t\ng", 7), 13u);
  EXPECT_EQ(Gpt2ChunkEnd("abcdefghijklmnop", 4), 16u);
}

// CRLF text and lines that end or begin with other scripts' characters are
// cut too ("x\r|\ny", and "x\n|y" for any x and y other than white space):
// before, such text had no cut and was encoded as one part (one thread, its
// ids held whole). White space of other scripts (NBSP, U+0085, U+2028,
// U+3000) is still not cut around, bytes that are not UTF-8 are; and the
// parts give the ids of the whole.
TEST(Gpt2TokenizerTest, CrlfAndOtherScriptsAreCutAlike) {
  EXPECT_EQ(Gpt2ChunkEnd("ab\r\ncd\r\nef", 5), 3u);           // ab\r | \ncd...
  EXPECT_EQ(Gpt2ChunkEnd("\xd0\x9c\xd0\xb8\n\xd0\xb4\xd0\xbe", 6), 5u);  // Ми\n | до
  EXPECT_EQ(Gpt2ChunkEnd("\xe3\x80\x82\n\xe8\xaf\x8d!", 5), 4u);      // 。\n | 词
  EXPECT_EQ(Gpt2ChunkEnd("ab\xc2\xa0\ncd", 5), 7u);             // NBSP before: none
  EXPECT_EQ(Gpt2ChunkEnd("ab\n\xe3\x80\x80" "cd", 4), 8u);         // U+3000 after: none
  EXPECT_EQ(Gpt2ChunkEnd("ab\xe2\x80\xa8\ncd", 6), 8u);         // U+2028 before: none
  EXPECT_EQ(Gpt2ChunkEnd("ab\x1f\ncd", 4), 4u);  // \x1f: not White_Space, so a cut
  EXPECT_EQ(Gpt2ChunkEnd("ab\xe2\x82\ncd", 5), 5u);             // a cut sequence: U+FFFD
  EXPECT_EQ(Gpt2ChunkEnd("ab\r\n\r\ncd", 4), 8u);              // a blank line: none
  // A line end first, with no bytes asked for: nothing read before the text.
  EXPECT_EQ(Gpt2ChunkEnd("\nab\ncd", 0), 4u);
  EXPECT_EQ(Gpt2ChunkEnd("\r\nab\ncd", 0), 5u);
  const std::vector<std::string> words = {
      "Light", "\xd0\x9c\xd0\xb8\xd1\x80",  // Мир
      "\xe8\xaf\x8d\xe8\xaf\xad",          // 词语
      "\xf0\x9f\x98\x80",                  // an emoji
      "caf\xc3\xa9", "42", "'s", "--", "\xc2\xa0", "\xc2\x85", "\xe3\x80\x80", "\x1c",
      "\xe2\x82", "\t", " ", ""};
  const std::vector<std::string> ends = {"\n", "\r\n", "\r\n\r\n", "\n\n", " \n", "\r"};
  std::string text;
  uint64_t state = 7;
  auto next = [&](size_t n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<size_t>((state >> 33) % n);
  };
  while (text.size() < 60000) {
    for (int k = 1 + next(4); k > 0; --k) text += words[next(words.size())] + (next(3) ? "" : " ");
    text += ends[next(ends.size())];
  }
  // The same pieces (any vocabulary's ids then), and GPT-2's ids.
  const std::vector<absl::string_view> whole_pieces = SplitGpt2Pretokens(text);
  const std::vector<int64_t> whole = Gpt2().Encode(text);
  for (size_t max_bytes : {size_t{16}, size_t{100}, size_t{4096}}) {
    std::vector<absl::string_view> pieces;
    std::vector<int64_t> parts;
    int chunks = 0;
    for (absl::string_view rest = text; !rest.empty(); ++chunks) {
      const size_t end = Gpt2ChunkEnd(rest, max_bytes);
      for (absl::string_view piece : SplitGpt2Pretokens(rest.substr(0, end))) {
        pieces.push_back(piece);
      }
      const std::vector<int64_t> ids = Gpt2().Encode(rest.substr(0, end));
      parts.insert(parts.end(), ids.begin(), ids.end());
      rest.remove_prefix(end);
    }
    EXPECT_GT(chunks, static_cast<int>(text.size() / max_bytes) / 8) << max_bytes;
    EXPECT_TRUE(pieces == whole_pieces) << "chunks of at most about " << max_bytes << " bytes";
    EXPECT_TRUE(parts == whole) << "chunks of at most about " << max_bytes << " bytes";
  }
  // CRLF text alone, and text of one other script: many parts.
  std::string crlf, cyrillic;
  for (int i = 0; i < 2000; ++i) {
    crlf += "Light is\r\n";
    cyrillic += "\xd0\x9c\xd0\xb8\xd1\x80\n";
  }
  for (const std::string& t : {crlf, cyrillic}) {
    EXPECT_LT(Gpt2ChunkEnd(t, 1000), 1000u);
  }
}

TEST(Gpt2TokenizerTest, PretokensFollowThePattern) {
  EXPECT_THAT(SplitGpt2Pretokens("I'm  here\n\n ok"),
              ElementsAre("I", "'m", " ", " here", "\n\n", " ok"));
  // A space joins the run after it, of whichever class; contractions are
  // lower case only; a trailing white space run is one piece.
  EXPECT_THAT(SplitGpt2Pretokens("x 42 ?! 'LL'll  "),
              ElementsAre("x", " 42", " ?!", " '", "LL", "'ll", "  "));
  // One white space character before a non-space is a piece of its own
  // unless it is U+0020.
  EXPECT_THAT(SplitGpt2Pretokens("a\tb\n c"), ElementsAre("a", "\t", "b", "\n", " c"));
  // Letters and numbers of any script; combining marks are neither.
  EXPECT_THAT(SplitGpt2Pretokens("日本 ٣٤ e\xcc\x81"),
              ElementsAre("日本", " ٣٤", " e", "\xcc\x81"));
  EXPECT_THAT(SplitGpt2Pretokens(""), ElementsAre());
}

TEST(Gpt2TokenizerTest, KeepsBytesThatAreNotUtf8) {
  const std::string text = "ab\xff\xfe cd\xe6\x97 \xf0\x9f\x98";
  absl::StatusOr<std::string> back = Gpt2().Decode(Gpt2().Encode(text));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, text);
  EXPECT_THAT(SplitGpt2Pretokens("ab\xff\xfe cd"), ElementsAre("ab", "\xff\xfe", " cd"));
}

TEST(Gpt2TokenizerTest, DecodeNamesAnIdOutsideTheVocabulary) {
  absl::StatusOr<std::string> text = Gpt2().Decode({15496, 50257});
  ASSERT_FALSE(text.ok());
  EXPECT_THAT(text.status().message(), HasSubstr("token 1 (id 50257)"));
  EXPECT_FALSE(Gpt2().Decode({-1}).ok());
}

// A byte-level vocabulary in Hugging Face's spelling (UTF-8, not \u escapes):
// the 256 byte characters in byte order (ids 0..255), then `extra`.
std::string SmallVocab(const std::vector<std::string>& extra) {
  std::vector<std::string> fields;
  int id = 0;
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const uint32_t cp = printable ? b : next++;
    std::string ch;
    tensor::AppendUtf8(cp, ch);
    fields.push_back(absl::StrCat(tensor::JsonQuote(ch), ": ", id++));
  }
  for (const std::string& token : extra) {
    fields.push_back(absl::StrCat(tensor::JsonQuote(token), ": ", id++));
  }
  return absl::StrCat("{", absl::StrJoin(fields, ", "), "}");
}

TEST(Gpt2TokenizerTest, ReadsAHuggingFaceFolder) {
  const std::string dir = absl::StrCat(testing::TempDir(), "/hf_tokenizer");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/vocab.json") << SmallVocab({"Ġt", "he", "Ġthe", "<|endoftext|>"});
  std::ofstream(dir + "/merges.txt") << "#version: 0.2\nĠ t\nh e\nĠt he\n";
  ASSERT_TRUE(Gpt2Tokenizer::IsTokenizerDir(dir));
  absl::StatusOr<Gpt2Tokenizer> t = Gpt2Tokenizer::Read(dir);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->vocab_size(), 260);
  EXPECT_EQ(t->num_merges(), 3);
  EXPECT_EQ(t->end_of_text(), 259);
  // " the the!" -> Ġthe Ġthe !   (byte b's token is id b here)
  EXPECT_THAT(t->Encode(" the the!"), ElementsAre(258, 258, '!'));
  // "the" has no leading space: t + he.
  EXPECT_THAT(t->Encode("the"), ElementsAre('t', 257));
  EXPECT_EQ(*t->Decode({258, '!', 259}), " the!<|endoftext|>");
}

TEST(Gpt2TokenizerTest, RefusesBadFilesNamingWhatIsWrong) {
  const std::string vocab = SmallVocab({"Ġt"});
  const auto error = [](const std::string& v, const std::string& m) {
    absl::StatusOr<Gpt2Tokenizer> t = Gpt2Tokenizer::Parse(v, m, "tok/");
    EXPECT_FALSE(t.ok());
    return std::string(t.status().message());
  };
  EXPECT_THAT(error("[1, 2]", ""), HasSubstr("tok/: the vocabulary is not a JSON object"));
  EXPECT_THAT(error("{\"a\": ", ""), HasSubstr("tok/: the vocabulary: bad JSON"));
  EXPECT_THAT(error("{\"a\": 0}", ""), HasSubstr("no token for byte 0"));
  EXPECT_THAT(error("{\"a\": 1.5}", ""), HasSubstr("token \"a\" has id 1.5"));
  EXPECT_THAT(error("{\"a\": 0, \"a\": 1}", ""), HasSubstr("lists token \"a\" twice"));
  EXPECT_THAT(error("{\"a\": 0, \"b\": 0}", ""), HasSubstr("gives id 0 to two tokens"));
  EXPECT_THAT(error("{\"a b\": 0}", ""), HasSubstr("\"a b\" (id 0) has a character"));
  EXPECT_THAT(error(vocab, "Ġ t\nĠtx\n"), HasSubstr("merges line 2 'Ġtx' is not two tokens"));
  EXPECT_THAT(error(vocab, "Ġ t\nĠ x y\n"), HasSubstr("merges line 2"));
  EXPECT_THAT(error(vocab, "Ġt h\n"), HasSubstr("merges line 1 'Ġt h': \"Ġth\" is not in"));
  EXPECT_THAT(error(vocab, "Ġ t\nq zz\n"), HasSubstr("\"zz\" is not in the vocabulary"));

  const std::string empty = absl::StrCat(testing::TempDir(), "/no_tokenizer");
  std::filesystem::create_directories(empty);
  EXPECT_FALSE(Gpt2Tokenizer::IsTokenizerDir(empty));
  absl::StatusOr<Gpt2Tokenizer> none = Gpt2Tokenizer::Read(empty);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr("neither vocab.json + merges.txt"));
  std::ofstream(empty + "/vocab.json") << vocab;  // merges.txt missing
  none = Gpt2Tokenizer::Read(empty);
  EXPECT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(), HasSubstr("merges.txt"));

  // A .bin's record of a SentencePiece model (tools/spm_tokenize.py's), by
  // what it is, not as a folder that does not exist.
  const std::string spm = absl::StrCat("sentencepiece:", empty, "/spiece.model");
  std::ofstream(empty + "/spiece.model") << "x";
  none = Gpt2Tokenizer::Open(spm);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(none.status().message(),
            absl::StrCat(spm, " is a SentencePiece model (tools/spm_tokenize.py writes it for "
                              "T5), not a GPT-2 BPE tokenizer, which is the only kind read here: "
                              "encode the text with //tools:tokenize"));
}

}  // namespace
}  // namespace data
