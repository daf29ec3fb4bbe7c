// Tests of the JSON reader and string quoting (json.h).
#include "tensor/json.h"

#include "gtest/gtest.h"

namespace tensor {
namespace {

TEST(JsonTest, ParsesNestedValuesInOrder) {
  absl::StatusOr<Json> j =
      ParseJson(R"({"a": [1, -2.5e3, "x\"y\u00e9"], "b": {"c": true, "d": null}, "a": false})");
  ASSERT_TRUE(j.ok()) << j.status();
  ASSERT_EQ(j->kind, Json::Kind::kObject);
  ASSERT_EQ(j->fields.size(), 3u);
  const Json* a = j->Get("a");  // the first of two
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->kind, Json::Kind::kArray);
  ASSERT_EQ(a->items.size(), 3u);
  EXPECT_EQ(a->items[0].text, "1");
  EXPECT_EQ(a->items[1].kind, Json::Kind::kNumber);
  EXPECT_EQ(a->items[1].text, "-2.5e3");
  EXPECT_EQ(a->items[2].text, "x\"y\xc3\xa9");
  EXPECT_EQ(j->Get("b")->Get("c")->text, "true");
  EXPECT_EQ(j->Get("b")->Get("d")->kind, Json::Kind::kNull);
  EXPECT_EQ(j->Get("missing"), nullptr);
}

TEST(JsonTest, ErrorsNameTheByte) {
  for (const char* bad : {"{\"a\" 1}", "[1, 2", "{} x", "\"abc", "tru"}) {
    absl::StatusOr<Json> j = ParseJson(bad);
    ASSERT_FALSE(j.ok()) << bad;
    EXPECT_EQ(j.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(j.status().message().find("bad JSON at byte"), absl::string_view::npos) << bad;
  }
  EXPECT_FALSE(ParseJson("[[[[1]]]]", 2).ok());
  EXPECT_TRUE(ParseJson("[[[[1]]]]", 4).ok());
}

// \u escapes as Python's json.dumps writes them: a character past U+FFFF
// as a UTF-16 surrogate pair (one code point, 4 UTF-8 bytes); upper-case hex
// and \/ too. A pair cut in half, a non-hex digit or an unknown escape is an
// error naming its byte.
TEST(JsonTest, EscapesIncludingSurrogatePairsDecodeToUtf8) {
  absl::StatusOr<Json> j = ParseJson(R"("\ud83d\ude00 \u00E9\/\\")");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(j->text, "\xF0\x9F\x98\x80 \xC3\xA9/\\");
  for (const char* bad : {R"("\uZZZZ")", R"("\u12")", R"("\ud83d")", R"("\ud83dx")",
                          R"("\ud83d\u0041")", R"("\ude00")", R"("\x41")"}) {
    absl::StatusOr<Json> b = ParseJson(bad);
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_EQ(b.status().code(), absl::StatusCode::kDataLoss) << bad;
    EXPECT_NE(b.status().message().find("bad JSON at byte"), absl::string_view::npos) << bad;
  }
  EXPECT_NE(ParseJson(R"("\ud83d")").status().message().find("high surrogate"),
            absl::string_view::npos);
}

TEST(JsonTest, ValueBudgetIsAnErrorNotAnAllocation) {
  // [1,2,3] is four values (the array and three numbers).
  EXPECT_TRUE(ParseJson("[1,2,3]", 32, 4).ok());
  absl::StatusOr<Json> j = ParseJson("[1,2,3]", 32, 3);
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(j.status().message().find("more than 3 values"), absl::string_view::npos)
      << j.status();
  std::string zeros = "[0";
  for (int i = 1; i < 100000; ++i) zeros += ",0";
  zeros += "]";
  EXPECT_FALSE(ParseJson(zeros, 32, 1000).ok());
  EXPECT_TRUE(ParseJson(zeros).ok());
}

TEST(JsonTest, QuoteRoundTrips) {
  const std::string s = "a\"b\\c\nd\te\rf\x01g";
  const std::string q = JsonQuote(s);
  EXPECT_EQ(q, "\"a\\\"b\\\\c\\nd\\te\\rf\\u0001g\"");
  absl::StatusOr<Json> j = ParseJson(q);
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j->text, s);
}

}  // namespace
}  // namespace tensor
