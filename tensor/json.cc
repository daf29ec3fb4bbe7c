// The small JSON reader and string quoting (json.h).
#include "tensor/json.h"

#include <cctype>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tensor {
namespace {

class JsonParser {
 public:
  JsonParser(const std::string& s, int max_depth, int64_t max_values)
      : s_(s), max_depth_(max_depth), max_values_(max_values) {}

  absl::StatusOr<Json> ParseDocument() {
    absl::StatusOr<Json> v = Parse(0);
    if (!v.ok()) return v;
    SkipSpace();
    if (pos_ != s_.size()) return Error("trailing characters");
    return v;
  }

 private:
  absl::Status Error(const std::string& what) const {
    return absl::DataLossError(absl::StrCat("bad JSON at byte ", pos_, ": ", what));
  }
  void SkipSpace() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\t' ||
                                s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Consume(char c) {
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  // The 4 hex digits after "\\u".
  absl::StatusOr<uint32_t> ParseHex4() {
    if (pos_ + 4 > s_.size()) return Error("short \\u escape");
    uint32_t code = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = s_[pos_];
      const int digit = h >= '0' && h <= '9'   ? h - '0'
                        : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                               : -1;
      if (digit < 0) return Error("a \\u escape needs 4 hex digits");
      code = code * 16 + static_cast<uint32_t>(digit);
      ++pos_;
    }
    return code;
  }

  absl::StatusOr<std::string> ParseString() {
    if (!Consume('"')) return Error("expected a string");
    std::string out;
    while (pos_ < s_.size() && s_[pos_] != '"') {
      char c = s_[pos_++];
      if (c == '\\') {
        if (pos_ >= s_.size()) break;
        const char e = s_[pos_++];
        switch (e) {
          case 'n': out += '\n'; break;
          case 't': out += '\t'; break;
          case 'r': out += '\r'; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case '"': case '\\': case '/': out += e; break;
          case 'u': {
            absl::StatusOr<uint32_t> code = ParseHex4();
            if (!code.ok()) return code.status();
            // A character past U+FFFF comes as a UTF-16 pair (Python's
            // json.dumps writes an emoji so): one code point, 4 UTF-8 bytes.
            if (*code >= 0xDC00 && *code <= 0xDFFF) {
              return Error("a \\u low surrogate without the high one before it");
            }
            if (*code >= 0xD800 && *code <= 0xDBFF) {
              if (s_.compare(pos_, 2, "\\u") != 0) {
                return Error("a \\u high surrogate without the low one after it");
              }
              pos_ += 2;
              absl::StatusOr<uint32_t> low = ParseHex4();
              if (!low.ok()) return low.status();
              if (*low < 0xDC00 || *low > 0xDFFF) {
                return Error("a \\u high surrogate without the low one after it");
              }
              *code = 0x10000 + ((*code - 0xD800) << 10) + (*low - 0xDC00);
            }
            AppendUtf8(*code, out);
            break;
          }
          default: return Error(absl::StrCat("bad escape \\", std::string(1, e)));
        }
      } else {
        out += c;
      }
    }
    if (pos_ >= s_.size()) return Error("unterminated string");
    ++pos_;
    return out;
  }

  absl::StatusOr<Json> Parse(int depth) {
    if (depth > max_depth_) return Error("nested too deeply");
    SkipSpace();
    if (pos_ >= s_.size()) return Error("unexpected end");
    if (++values_ > max_values_) return Error(absl::StrCat("more than ", max_values_, " values"));
    Json v;
    const char c = s_[pos_];
    if (c == '{') {
      ++pos_;
      v.kind = Json::Kind::kObject;
      if (Consume('}')) return v;
      do {
        absl::StatusOr<std::string> key = ParseString();
        if (!key.ok()) return key.status();
        if (!Consume(':')) return Error("expected ':'");
        absl::StatusOr<Json> value = Parse(depth + 1);
        if (!value.ok()) return value;
        v.fields.emplace_back(std::move(*key), std::move(*value));
      } while (Consume(','));
      if (!Consume('}')) return Error("expected '}'");
    } else if (c == '[') {
      ++pos_;
      v.kind = Json::Kind::kArray;
      if (Consume(']')) return v;
      do {
        absl::StatusOr<Json> item = Parse(depth + 1);
        if (!item.ok()) return item;
        v.items.push_back(std::move(*item));
      } while (Consume(','));
      if (!Consume(']')) return Error("expected ']'");
    } else if (c == '"') {
      absl::StatusOr<std::string> s = ParseString();
      if (!s.ok()) return s.status();
      v.kind = Json::Kind::kString;
      v.text = std::move(*s);
    } else if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) {
      const size_t start = pos_;
      while (pos_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[pos_])) ||
                                  std::strchr("+-.eE", s_[pos_]))) {
        ++pos_;
      }
      v.kind = Json::Kind::kNumber;
      v.text = s_.substr(start, pos_ - start);
    } else if (s_.compare(pos_, 4, "true") == 0 || s_.compare(pos_, 4, "null") == 0) {
      v.kind = s_[pos_] == 't' ? Json::Kind::kBool : Json::Kind::kNull;
      v.text = s_.substr(pos_, 4);
      pos_ += 4;
    } else if (s_.compare(pos_, 5, "false") == 0) {
      v.kind = Json::Kind::kBool;
      v.text = "false";
      pos_ += 5;
    } else {
      return Error(absl::StrCat("unexpected character '", std::string(1, c), "'"));
    }
    return v;
  }

  const std::string& s_;
  const int max_depth_;
  const int64_t max_values_;
  int64_t values_ = 0;
  size_t pos_ = 0;
};

}  // namespace

const Json* Json::Get(const std::string& key) const {
  for (const auto& [k, v] : fields) {
    if (k == key) return &v;
  }
  return nullptr;
}

absl::StatusOr<Json> ParseJson(const std::string& text, int max_depth, int64_t max_values) {
  return JsonParser(text, max_depth, max_values).ParseDocument();
}

void AppendUtf8(uint32_t code_point, std::string& out) {
  const uint32_t c = code_point;
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xc0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3f));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xe0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (c & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (c & 0x3f));
  }
}

std::string JsonQuote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", static_cast<int>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

}  // namespace tensor
