// UTF-8 as the tokenizers read it (utf8.h).
#include "models/data/utf8.h"

namespace data {

int DecodeUtf8(absl::string_view text, size_t pos, uint32_t& cp) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t b0 = byte(pos);
  cp = 0xFFFD;
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  int len;
  uint32_t value, min;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, value = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, value = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, value = b0 & 0x07, min = 0x10000;
  } else {
    return 1;
  }
  if (pos + len > text.size()) return 1;
  for (int k = 1; k < len; ++k) {
    if ((byte(pos + k) & 0xC0) != 0x80) return 1;
    value = (value << 6) | (byte(pos + k) & 0x3F);
  }
  if (value < min || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) return 1;
  cp = value;
  return len;
}

size_t FirstNonUtf8(absl::string_view text) {
  for (size_t at = 0; at < text.size();) {
    uint32_t cp = 0;
    const int len = DecodeUtf8(text, at, cp);
    // An invalid sequence reads as one byte (a lone ASCII byte is valid).
    if (len == 1 && static_cast<unsigned char>(text[at]) >= 0x80) return at;
    at += static_cast<size_t>(len);
  }
  return absl::string_view::npos;
}

}  // namespace data
