// index.json of a sharded checkpoint: its records as JSON, and reading and
// validating them (see sharded_checkpoint_index.h).
#include "dist/sharded_checkpoint_index.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tensor/json.h"
#include "tensor/read_file.h"
#include "tensor/safetensors.h"

namespace dist::sharded {
namespace {

using tensor::Json;
using tensor::JsonQuote;

std::string SliceJson(const SliceRec& s) {
  std::vector<std::string> crcs;
  for (uint32_t c : s.crcs) crcs.push_back(JsonQuote(Hex32(c)));
  return absl::StrCat("{\"file\": ", s.file, ", \"tensor\": ", JsonQuote(s.tensor),
                      ", \"begin\": ", s.begin, ", \"end\": ", s.end, ", \"crc32c\": [",
                      absl::StrJoin(crcs, ", "), "]}");
}

std::string SlicesJson(const std::vector<SliceRec>& slices, const std::string& indent) {
  if (slices.empty()) return "[]";
  std::vector<std::string> parts;
  for (const SliceRec& s : slices) parts.push_back(absl::StrCat(indent, "  ", SliceJson(s)));
  return absl::StrCat("[\n", absl::StrJoin(parts, ",\n"), "\n", indent, "]");
}

// Field readers: errors name the field ("index.json: params[3].shape ...").
class Fields {
 public:
  Fields(const Json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  absl::Status Bad(const std::string& key, const std::string& what) const {
    return absl::DataLossError(absl::StrCat(where_, key.empty() ? "" : ".", key, " ", what));
  }
  absl::StatusOr<const Json*> Get(const std::string& key, Json::Kind kind,
                                  bool optional = false) const {
    const Json* v = obj_.Get(key);
    if (v == nullptr) {
      if (optional) return nullptr;
      return Bad(key, "is missing");
    }
    if (v->kind != kind) return Bad(key, "has the wrong type");
    return v;
  }
  absl::StatusOr<std::string> Str(const std::string& key) const {
    absl::StatusOr<const Json*> v = Get(key, Json::Kind::kString);
    if (!v.ok()) return v.status();
    return (*v)->text;
  }
  absl::StatusOr<int64_t> Int(const std::string& key) const {
    absl::StatusOr<const Json*> v = Get(key, Json::Kind::kNumber);
    if (!v.ok()) return v.status();
    int64_t x = 0;
    if (!absl::SimpleAtoi((*v)->text, &x)) return Bad(key, "is not an integer");
    return x;
  }
  absl::StatusOr<bool> Bool(const std::string& key) const {
    absl::StatusOr<const Json*> v = Get(key, Json::Kind::kBool);
    if (!v.ok()) return v.status();
    return (*v)->text == "true";
  }

 private:
  const Json& obj_;
  std::string where_;
};

#define SC_ASSIGN(lhs, expr)                \
  do {                                      \
    auto _sc_v = (expr);                    \
    if (!_sc_v.ok()) return _sc_v.status(); \
    lhs = std::move(*_sc_v);                \
  } while (0)

absl::StatusOr<std::vector<SliceRec>> ParseSlices(const Json& arr, const std::string& where) {
  if (arr.kind != Json::Kind::kArray) {
    return absl::DataLossError(absl::StrCat(where, " is not an array"));
  }
  std::vector<SliceRec> out;
  for (size_t i = 0; i < arr.items.size(); ++i) {
    const std::string w = absl::StrCat(where, "[", i, "]");
    if (arr.items[i].kind != Json::Kind::kObject) {
      return absl::DataLossError(absl::StrCat(w, " is not an object"));
    }
    Fields f(arr.items[i], w);
    SliceRec s;
    int64_t file = 0;
    SC_ASSIGN(file, f.Int("file"));
    if (file < 0 || file > std::numeric_limits<int>::max()) {  // not truncated into range
      return absl::DataLossError(absl::StrCat(w, ".file ", file, " is not a file number"));
    }
    s.file = static_cast<int>(file);
    SC_ASSIGN(s.tensor, f.Str("tensor"));
    SC_ASSIGN(s.begin, f.Int("begin"));
    SC_ASSIGN(s.end, f.Int("end"));
    const Json* crcs = nullptr;
    SC_ASSIGN(crcs, f.Get("crc32c", Json::Kind::kArray));
    for (const Json& c : crcs->items) {
      uint32_t x = 0;
      if (c.kind != Json::Kind::kString || c.text.size() != 8 || !absl::SimpleHexAtoi(c.text, &x)) {
        return absl::DataLossError(absl::StrCat(w, ".crc32c holds a bad checksum"));
      }
      s.crcs.push_back(x);
    }
    out.push_back(std::move(s));
  }
  return out;
}

// index.json's "buffers": {"file", "bytes", "tensors": [{"name", "shape",
// "dtype", "crc32c"}, ...]}.
absl::StatusOr<BuffersFileRec> ParseBuffers(const Json& obj) {
  Fields f(obj, "buffers");
  BuffersFileRec out;
  std::string file;
  SC_ASSIGN(file, f.Str("file"));
  if (file != kBuffersFile) return f.Bad("file", absl::StrCat("is not ", kBuffersFile));
  SC_ASSIGN(out.bytes, f.Int("bytes"));
  const Json* tensors = nullptr;
  SC_ASSIGN(tensors, f.Get("tensors", Json::Kind::kArray));
  for (size_t i = 0; i < tensors->items.size(); ++i) {
    const std::string where = absl::StrCat("buffers.tensors[", i, "]");
    if (tensors->items[i].kind != Json::Kind::kObject) {
      return absl::DataLossError(absl::StrCat(where, " is not an object"));
    }
    Fields fb(tensors->items[i], where);
    BufferRec b;
    SC_ASSIGN(b.name, fb.Str("name"));
    const Json* shape = nullptr;
    SC_ASSIGN(shape, fb.Get("shape", Json::Kind::kArray));
    for (const Json& d : shape->items) {
      int64_t v = 0;
      if (d.kind != Json::Kind::kNumber || !absl::SimpleAtoi(d.text, &v) || v < 0 ||
          v > (int64_t{1} << 40)) {  // buffers are small: no product overflows
        return absl::DataLossError(absl::StrCat(where, ".shape is not a shape"));
      }
      b.shape.push_back(v);
    }
    std::string dtype;
    SC_ASSIGN(dtype, fb.Str("dtype"));
    absl::StatusOr<tensor::Dtype> parsed = tensor::DtypeFromName(absl::AsciiStrToLower(dtype));
    if (!parsed.ok() || absl::AsciiStrToUpper(tensor::DtypeName(*parsed)) != dtype) {
      return absl::DataLossError(absl::StrCat(where, ".dtype '", dtype, "' is not a dtype"));
    }
    b.dtype = *parsed;
    std::string crc;
    SC_ASSIGN(crc, fb.Str("crc32c"));
    if (crc.size() != 8 || !absl::SimpleHexAtoi(crc, &b.crc)) {
      return absl::DataLossError(absl::StrCat(where, ".crc32c is not a checksum"));
    }
    out.tensors.push_back(std::move(b));
  }
  return out;
}

// The slices must tile [0, numel) exactly, name existing files and carry one
// checksum per block.
absl::Status CheckTiling(std::vector<SliceRec>& slices, int64_t numel, const Index& x,
                         const std::string& what) {
  std::sort(slices.begin(), slices.end(),
            [](const SliceRec& a, const SliceRec& b) { return a.begin < b.begin; });
  int64_t pos = 0;
  for (const SliceRec& s : slices) {
    if (s.file < 0 || s.file >= static_cast<int>(x.files.size())) {
      return absl::DataLossError(absl::StrCat(what, ": slice '", s.tensor, "' names file #", s.file,
                                              " of ", x.files.size()));
    }
    if (s.end > numel && s.begin == pos) {
      return absl::DataLossError(absl::StrCat(what, ": slice [", s.begin, ", ", s.end,
                                              ") ends past its ", numel, " elements"));
    }
    if (s.begin != pos || s.end <= s.begin) {
      return absl::DataLossError(absl::StrCat(what, ": slices do not tile its ", numel,
                                              " elements (a slice [", s.begin, ", ", s.end,
                                              ") where element ", pos, " was expected)"));
    }
    const int64_t blocks = (s.end - s.begin + x.crc_block - 1) / x.crc_block;
    if (static_cast<int64_t>(s.crcs.size()) != blocks) {
      return absl::DataLossError(absl::StrCat(what, ": slice '", s.tensor, "' has ", s.crcs.size(),
                                              " checksums for ", blocks, " blocks"));
    }
    pos = s.end;
  }
  if (pos != numel) {
    return absl::DataLossError(
        absl::StrCat(what, ": slices cover ", pos, " of its ", numel, " elements"));
  }
  return absl::OkStatus();
}

// Whether index.json's text is the one its writer checksummed: `crc` (the
// value of kIndexCrcKey) is the CRC-32C of every byte before that field's
// line. DataLoss naming both checksums when not.
absl::Status CheckIndexText(const std::string& text, const std::string& crc) {
  const std::string line = absl::StrCat("\n  ", JsonQuote(kIndexCrcKey), ": ");
  const size_t at = text.rfind(line);
  const std::string actual =
      at == std::string::npos ? "none" : Hex32(tensor::Crc32c(text.data(), at + 1));
  if (at != std::string::npos && actual == crc) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      "its text does not match its checksum (", kIndexCrcKey, " ", crc, ", the text's ", actual,
      "): it changed after it was written (a damaged disk or copy; an index.json edited by hand "
      "must drop \"", kIndexCrcKey, "\")"));
}

}  // namespace

std::string NewCheckpointId() {
  std::random_device rd;
  const uint64_t hi = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  const uint64_t lo =
      static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  return absl::StrFormat("%016x%08x", hi ^ lo, static_cast<uint32_t>(::getpid()));
}

std::string Hex32(uint32_t x) { return absl::StrFormat("%08x", x); }

std::string ShardFileName(int r, int n) {
  return absl::StrCat("shard_", r, "_of_", n, ".safetensors");
}

bool IsCheckpointFile(const std::string& name) {
  if (name == kIndexFile) return true;
  if (absl::StartsWith(name, "index.json.tmp.")) return true;
  if (name == kBuffersFile || absl::StartsWith(name, absl::StrCat(kBuffersFile, ".tmp."))) {
    return true;
  }
  int r = 0, n = 0;
  char tail[32] = {0};
  if (std::sscanf(name.c_str(), "shard_%d_of_%d.safetenso%31s", &r, &n, tail) == 3) {
    return std::string(tail) == "rs" || absl::StartsWith(std::string(tail), "rs.tmp.");
  }
  return false;
}

std::string SliceTensorName(const std::string& kind, const std::string& param, int64_t begin) {
  return kind == kValueKind ? absl::StrCat("model/", param, "@", begin)
                            : absl::StrCat("optim/", kind, "/", param, "@", begin);
}

std::vector<uint32_t> BlockCrcs(const float* data, int64_t n, int64_t block) {
  std::vector<uint32_t> crcs;
  for (int64_t b = 0; b < n; b += block) {
    crcs.push_back(tensor::Crc32c(data + b, std::min(block, n - b) * 4));
  }
  return crcs;
}

std::string IndexToJson(const Index& x) {
  std::string out = "{\n";
  absl::StrAppend(&out, "  \"format\": ", JsonQuote(kFormat), ",\n");
  const int version = x.model_buffers.tensors.empty() ? kVersionWithoutBuffers : kVersion;
  absl::StrAppend(&out, "  \"version\": ", version, ",\n");
  absl::StrAppend(&out, "  \"checkpoint_id\": ", JsonQuote(x.id), ",\n");
  absl::StrAppend(&out, "  \"writer\": ", JsonQuote(x.writer), ",\n");
  absl::StrAppend(&out, "  \"strategy\": ", JsonQuote(x.strategy), ",\n");
  absl::StrAppend(&out, "  \"world_size\": ", x.world_size, ",\n");
  std::vector<std::string> units;
  for (const auto& u : x.units) units.push_back(JsonQuote(u));
  absl::StrAppend(&out, "  \"units\": [", absl::StrJoin(units, ", "), "],\n");
  std::vector<std::string> files;
  for (const auto& f : x.files) {
    files.push_back(
        absl::StrCat("    {\"name\": ", JsonQuote(f.name), ", \"bytes\": ", f.bytes, "}"));
  }
  absl::StrAppend(&out, "  \"files\": [\n", absl::StrJoin(files, ",\n"), "\n  ],\n");
  absl::StrAppend(&out, "  \"crc32c_block_elements\": ", x.crc_block, ",\n");
  std::vector<std::string> bufs;
  for (const auto& b : x.buffers) bufs.push_back(JsonQuote(b));
  absl::StrAppend(&out, "  \"optimizer\": {\"name\": ", JsonQuote(x.optimizer), ", \"buffers\": [",
                  absl::StrJoin(bufs, ", "), "], \"lr\": ", JsonQuote(x.lr),
                  ", \"has_state\": ", x.has_state ? "true" : "false", ", \"step\": ", x.step,
                  "},\n");
  std::vector<std::string> params;
  for (const ParamRec& p : x.params) {
    std::string s = absl::StrCat("    {\"name\": ", JsonQuote(p.name), ", \"shape\": [",
                                 absl::StrJoin(p.shape.dims(), ", "), "], \"numel\": ", p.numel,
                                 ", \"dtype\": \"F32\"");
    if (p.has_state) absl::StrAppend(&s, ", \"step\": ", p.step);
    absl::StrAppend(&s, ",\n     \"value\": ", SlicesJson(p.value, "     "));
    if (p.has_state) {
      std::vector<std::string> st;
      for (const std::string& b : x.buffers) {
        auto it = p.state.find(b);
        st.push_back(absl::StrCat(
            "      ", JsonQuote(b), ": ",
            SlicesJson(it == p.state.end() ? std::vector<SliceRec>{} : it->second, "      ")));
      }
      absl::StrAppend(&s, ",\n     \"state\": {\n", absl::StrJoin(st, ",\n"), "\n     }");
    }
    s += "}";
    params.push_back(std::move(s));
  }
  absl::StrAppend(&out, "  \"params\": [\n", absl::StrJoin(params, ",\n"), "\n  ],\n");
  if (!x.model_buffers.tensors.empty()) {
    std::vector<std::string> bufs;
    for (const BufferRec& b : x.model_buffers.tensors) {
      bufs.push_back(absl::StrCat("    {\"name\": ", JsonQuote(b.name), ", \"shape\": [",
                                  absl::StrJoin(b.shape.dims(), ", "), "], \"dtype\": ",
                                  JsonQuote(absl::AsciiStrToUpper(tensor::DtypeName(b.dtype))),
                                  ", \"crc32c\": ", JsonQuote(Hex32(b.crc)), "}"));
    }
    absl::StrAppend(&out, "  \"buffers\": {\"file\": ", JsonQuote(kBuffersFile),
                    ", \"bytes\": ", x.model_buffers.bytes, ", \"tensors\": [\n",
                    absl::StrJoin(bufs, ",\n"), "\n  ]},\n");
  }
  std::vector<std::string> extra;
  for (const auto& [k, v] : x.extra) {
    extra.push_back(absl::StrCat("    ", JsonQuote(k), ": ", JsonQuote(v)));
  }
  absl::StrAppend(&out, "  \"extra\": {", extra.empty() ? "" : "\n", absl::StrJoin(extra, ",\n"),
                  extra.empty() ? "" : "\n  ", "},\n");
  // Last, the checksum of every byte above.
  absl::StrAppend(&out, "  ", JsonQuote(kIndexCrcKey), ": ",
                  JsonQuote(Hex32(tensor::Crc32c(out.data(), out.size()))), "\n}\n");
  return out;
}

absl::Status ValidateIndex(Index& x) {
  std::set<std::string> file_names;
  for (const FileRec& f : x.files) {
    if (f.name.empty() || f.name.find('/') != std::string::npos || f.name[0] == '.' ||
        !file_names.insert(f.name).second || f.bytes < 0) {
      return absl::DataLossError(absl::StrCat("bad file entry '", f.name, "'"));
    }
  }
  // Bounded so that a slice's block count cannot overflow (a block of more
  // than 2^40 elements would make its checksums cover nothing).
  if (x.crc_block <= 0 || x.crc_block > (int64_t{1} << 40)) {
    return absl::DataLossError(absl::StrCat("bad crc32c_block_elements ", x.crc_block,
                                            " (must be in [1, 2^40])"));
  }
  std::set<std::string> buffer_names;
  for (const BufferRec& b : x.model_buffers.tensors) {
    if (b.name.empty() || !buffer_names.insert(b.name).second) {
      return absl::DataLossError(absl::StrCat("buffer '", b.name, "' is listed twice or unnamed"));
    }
  }
  if (x.model_buffers.bytes < 0) {
    return absl::DataLossError(absl::StrCat("bad ", kBuffersFile, " size ", x.model_buffers.bytes));
  }
  x.by_name.clear();
  for (size_t i = 0; i < x.params.size(); ++i) {
    ParamRec& p = x.params[i];
    const std::string what = absl::StrCat("parameter '", p.name, "'");
    if (!x.by_name.emplace(p.name, i).second) {
      return absl::DataLossError(absl::StrCat(what, " is listed twice"));
    }
    if (p.shape.numel() != p.numel || p.numel < 0) {
      return absl::DataLossError(
          absl::StrCat(what, ": numel ", p.numel, " does not match shape ", p.shape.ToString()));
    }
    absl::Status tiled = CheckTiling(p.value, p.numel, x, what);
    if (!tiled.ok()) return tiled;
    if (p.has_state) {
      if (!x.has_state) {
        return absl::DataLossError(
            absl::StrCat(what, " has optimizer state but the optimizer has none"));
      }
      for (const auto& [key, slices] : p.state) {
        if (std::find(x.buffers.begin(), x.buffers.end(), key) == x.buffers.end()) {
          return absl::DataLossError(absl::StrCat(what, ": unknown optimizer buffer '", key, "'"));
        }
      }
      for (const std::string& b : x.buffers) {
        auto it = p.state.find(b);
        if (it == p.state.end()) {
          return absl::DataLossError(absl::StrCat(what, ": optimizer buffer '", b, "' is missing"));
        }
        tiled = CheckTiling(it->second, p.numel, x, absl::StrCat(what, " ", b));
        if (!tiled.ok()) return tiled;
      }
    } else if (!p.state.empty()) {
      return absl::DataLossError(absl::StrCat(what, " has optimizer buffers but no step"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Index> ParseIndex(const std::string& text) {
  absl::StatusOr<Json> doc = tensor::ParseJson(text);
  if (!doc.ok()) return doc.status();
  if (doc->kind != Json::Kind::kObject) return absl::DataLossError("not a JSON object");
  Fields f(*doc, "");
  Index x;
  std::string format;
  SC_ASSIGN(format, f.Str("format"));
  if (format != kFormat) {
    return absl::InvalidArgumentError(
        absl::StrCat("format is '", format, "', expected '", kFormat, "'"));
  }
  int64_t version = 0;
  SC_ASSIGN(version, f.Int("version"));
  if (version < kVersionWithoutBuffers || version > kVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "format version ", version, " (this build reads versions ", kVersionWithoutBuffers,
        " to ", kVersion, version > kVersion ? "; written by a newer build" : "", ")"));
  }
  x.version = static_cast<int>(version);
  SC_ASSIGN(x.id, f.Str("checkpoint_id"));
  SC_ASSIGN(x.writer, f.Str("writer"));
  SC_ASSIGN(x.strategy, f.Str("strategy"));
  int64_t world = 0;
  SC_ASSIGN(world, f.Int("world_size"));
  if (world < 1 || world > std::numeric_limits<int>::max()) {  // not truncated into range
    return absl::DataLossError(absl::StrCat("world_size ", world, " is not a world size"));
  }
  x.world_size = static_cast<int>(world);
  const Json* units = nullptr;
  SC_ASSIGN(units, f.Get("units", Json::Kind::kArray));
  for (const Json& u : units->items) x.units.push_back(u.text);
  const Json* files = nullptr;
  SC_ASSIGN(files, f.Get("files", Json::Kind::kArray));
  for (size_t i = 0; i < files->items.size(); ++i) {
    if (files->items[i].kind != Json::Kind::kObject) {
      return absl::DataLossError("files[] entry is not an object");
    }
    Fields ff(files->items[i], absl::StrCat("files[", i, "]"));
    FileRec r;
    SC_ASSIGN(r.name, ff.Str("name"));
    SC_ASSIGN(r.bytes, ff.Int("bytes"));
    x.files.push_back(std::move(r));
  }
  SC_ASSIGN(x.crc_block, f.Int("crc32c_block_elements"));
  const Json* opt = nullptr;
  SC_ASSIGN(opt, f.Get("optimizer", Json::Kind::kObject));
  Fields fo(*opt, "optimizer");
  SC_ASSIGN(x.optimizer, fo.Str("name"));
  const Json* bufs = nullptr;
  SC_ASSIGN(bufs, fo.Get("buffers", Json::Kind::kArray));
  for (const Json& b : bufs->items) x.buffers.push_back(b.text);
  SC_ASSIGN(x.lr, fo.Str("lr"));
  SC_ASSIGN(x.has_state, fo.Bool("has_state"));
  SC_ASSIGN(x.step, fo.Int("step"));
  const Json* params = nullptr;
  SC_ASSIGN(params, f.Get("params", Json::Kind::kArray));
  for (size_t i = 0; i < params->items.size(); ++i) {
    const std::string where = absl::StrCat("params[", i, "]");
    if (params->items[i].kind != Json::Kind::kObject) {
      return absl::DataLossError(absl::StrCat(where, " is not an object"));
    }
    Fields fp(params->items[i], where);
    ParamRec p;
    SC_ASSIGN(p.name, fp.Str("name"));
    const Json* shape = nullptr;
    SC_ASSIGN(shape, fp.Get("shape", Json::Kind::kArray));
    int64_t nonzero = 1;  // the product of the nonzero dimensions bounds every partial one
    for (const Json& d : shape->items) {
      int64_t v = 0;
      if (d.kind != Json::Kind::kNumber || !absl::SimpleAtoi(d.text, &v) || v < 0) {
        return absl::DataLossError(absl::StrCat(where, ".shape is not a shape"));
      }
      if (v > 0 && nonzero > std::numeric_limits<int64_t>::max() / v) {
        return absl::DataLossError(
            absl::StrCat(where, ".shape has more elements than an int64 counts"));
      }
      nonzero *= v > 0 ? v : 1;
      p.shape.push_back(v);
    }
    SC_ASSIGN(p.numel, fp.Int("numel"));
    std::string dtype;
    SC_ASSIGN(dtype, fp.Str("dtype"));
    if (dtype != "F32") {
      return absl::DataLossError(absl::StrCat(where, ".dtype is ", dtype, ", expected F32"));
    }
    const Json* step = nullptr;
    SC_ASSIGN(step, fp.Get("step", Json::Kind::kNumber, /*optional=*/true));
    if (step != nullptr) {
      p.has_state = true;
      SC_ASSIGN(p.step, fp.Int("step"));
    }
    const Json* value = nullptr;
    SC_ASSIGN(value, fp.Get("value", Json::Kind::kArray));
    SC_ASSIGN(p.value, ParseSlices(*value, where + ".value"));
    const Json* state = nullptr;
    SC_ASSIGN(state, fp.Get("state", Json::Kind::kObject, /*optional=*/true));
    if (state != nullptr) {
      for (const auto& [key, arr] : state->fields) {
        SC_ASSIGN(p.state[key], ParseSlices(arr, absl::StrCat(where, ".state.", key)));
      }
    }
    x.params.push_back(std::move(p));
  }
  const Json* buffers = nullptr;
  SC_ASSIGN(buffers, f.Get("buffers", Json::Kind::kObject, /*optional=*/true));
  if ((buffers != nullptr) != (version >= kVersion)) {
    return absl::DataLossError(absl::StrCat("format version ", version,
                                            buffers != nullptr ? " must not have a" : " needs a",
                                            " \"buffers\" field"));
  }
  if (buffers != nullptr) SC_ASSIGN(x.model_buffers, ParseBuffers(*buffers));
  const Json* extra = nullptr;
  SC_ASSIGN(extra, f.Get("extra", Json::Kind::kObject));
  for (const auto& [k, v] : extra->fields) {
    if (v.kind != Json::Kind::kString) return absl::DataLossError("extra values must be strings");
    x.extra[k] = v.text;
  }
  absl::Status valid = ValidateIndex(x);
  if (!valid.ok()) return valid;
  const Json* crc = nullptr;
  SC_ASSIGN(crc, f.Get(kIndexCrcKey, Json::Kind::kString, /*optional=*/true));
  if (crc != nullptr) {  // absent: written before index.json had one, or edited on purpose
    absl::Status intact = CheckIndexText(text, crc->text);
    if (!intact.ok()) return intact;
  }
  return x;
}

absl::StatusOr<Index> ReadIndex(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("checkpoint folder '", dir, "' does not exist"));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("'", dir, "' is not a folder"));
  }
  const std::string path = absl::StrCat(dir, "/", kIndexFile);
  absl::StatusOr<std::string> text = tensor::ReadFile(path);
  if (absl::IsNotFound(text.status())) {
    return absl::NotFoundError(
        absl::StrCat("'", path,
                     "' is missing: not a sharded checkpoint, or written by a world that did not "
                     "finish its save (shard files without index.json are never valid)"));
  }
  if (!text.ok()) return absl::UnavailableError(text.status().message());
  absl::StatusOr<Index> x = ParseIndex(*text);
  if (!x.ok()) {
    return absl::Status(x.status().code(),
                        absl::StrCat("'", path, "' is invalid: ", x.status().message()));
  }
  return x;
}

#undef SC_ASSIGN

}  // namespace dist::sharded
