// A small JSON reader and string quoting, for the project's own file headers
// and indexes (safetensors headers, sharded checkpoint indexes): RFC 8259
// values; \u escapes of the Basic Multilingual Plane (no surrogate pairs);
// numbers are kept as their literal text.
#ifndef TENSOR_JSON_H_
#define TENSOR_JSON_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tensor {

struct Json {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = Kind::kNull;
  std::string text;  // string contents, a number's literal, "true"/"false"/"null"
  std::vector<Json> items;                          // arrays
  std::vector<std::pair<std::string, Json>> fields;  // objects, in document order

  // The first field named `key` (objects), or nullptr.
  const Json* Get(const std::string& key) const;
};

// The default cap on the values of one document (each costs ~100 bytes of
// memory, some 40x its text).
inline constexpr int64_t kDefaultMaxJsonValues = int64_t{1} << 24;

// Parses one JSON document. DataLoss "bad JSON at byte N: <what>" on a syntax
// error, trailing characters, nesting deeper than max_depth, or more than
// max_values values (scalars, arrays and objects; checked as they are read, so
// a hostile document is refused before it costs more than max_values nodes).
absl::StatusOr<Json> ParseJson(const std::string& text, int max_depth = 32,
                               int64_t max_values = kDefaultMaxJsonValues);

// `s` as a JSON string literal: quoted, with '"', '\\' and control characters
// escaped.
std::string JsonQuote(const std::string& s);

// Appends the UTF-8 encoding of `code_point` (at most U+10FFFF) to `out`; the
// reader's \u escapes are decoded with it.
void AppendUtf8(uint32_t code_point, std::string& out);

}  // namespace tensor

#endif  // TENSOR_JSON_H_
