// Sharded checkpoints: per-parameter element ranges in per-rank safetensors
// files, an index.json, and the save / load protocols (see the header).
#include "dist/sharded_checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/match.h"
#include "tensor/memory_ledger.h"
#include "tensor/json.h"
#include "tensor/safetensors.h"

namespace dist {
namespace {

using tensor::Tensor;

constexpr char kIndexFile[] = "index.json";
constexpr char kFormat[] = "fsdp.sharded_checkpoint";
constexpr int kVersion = 1;
constexpr char kIdKey[] = "fsdp.checkpoint_id";
constexpr char kShardKey[] = "fsdp.shard";
constexpr char kValueKind[] = "value";
// Slices are checksummed in blocks of this many elements (1 MiB of fp32), so
// a reader that needs part of a slice reads and checks at most one partial
// block at each end.
constexpr int64_t kDefaultCrcBlock = int64_t{1} << 18;

std::mutex g_hooks_mu;
std::function<absl::Status(int)> g_write_fault;  // guarded by g_hooks_mu

// ---------------------------------------------------------------------------
// Errors across ranks.

std::string Hex32(uint32_t x) { return absl::StrFormat("%08x", x); }

// Every rank's (status, payload) as strings: "+<payload>" or "-<code>:<message>".
absl::StatusOr<std::vector<std::string>> AllGatherStrings(ProcessGroup& pg, const std::string& mine) {
  const int n = pg.size();
  const int64_t my_len = static_cast<int64_t>(mine.size());
  Tensor len = Tensor::FromData<int64_t>(absl::MakeConstSpan(&my_len, 1), {1});
  Tensor lens = Tensor::Empty({n}, tensor::Dtype::kI64);
  absl::Status s = pg.AllGatherSync(len, lens);
  if (!s.ok()) return s;
  int64_t max_len = 1;
  for (int r = 0; r < n; ++r) max_len = std::max(max_len, lens.data<int64_t>()[r]);
  Tensor buf = Tensor::Zeros({max_len}, tensor::Dtype::kU8);
  std::memcpy(buf.raw_data(), mine.data(), mine.size());
  Tensor all = Tensor::Empty({n * max_len}, tensor::Dtype::kU8);
  s = pg.AllGatherSync(buf, all);
  if (!s.ok()) return s;
  std::vector<std::string> out(n);
  const char* p = static_cast<const char*>(all.raw_data());
  for (int r = 0; r < n; ++r) out[r].assign(p + r * max_len, lens.data<int64_t>()[r]);
  return out;
}

// All-gathers every rank's status and payload. OK (with every payload) when
// every rank is OK; otherwise the same error on every rank, naming the failed
// ranks: "<what>: rank 1 of 4: <message>" ("ranks 0, 2 of 4: ..." for one
// message shared by several, "all 4 ranks: ..." when shared by all).
absl::StatusOr<std::vector<std::string>> Exchange(ProcessGroup& pg, const absl::Status& mine,
                                                  const std::string& payload,
                                                  const std::string& what) {
  const std::string enc = mine.ok() ? absl::StrCat("+", payload)
                                    : absl::StrCat("-", static_cast<int>(mine.code()), ":",
                                                   mine.message());
  absl::StatusOr<std::vector<std::string>> all = AllGatherStrings(pg, enc);
  if (!all.ok()) {
    return absl::Status(all.status().code(),
                        absl::StrCat(what, ": exchanging statuses failed: ", all.status().message(),
                                     mine.ok() ? "" : absl::StrCat(" (this rank: ", mine.message(), ")")));
  }
  std::vector<std::pair<std::string, std::vector<int>>> errors;  // message -> ranks
  absl::StatusCode code = absl::StatusCode::kOk;
  std::vector<std::string> payloads(all->size());
  for (size_t r = 0; r < all->size(); ++r) {
    const std::string& e = (*all)[r];
    if (!e.empty() && e[0] == '+') {
      payloads[r] = e.substr(1);
      continue;
    }
    const size_t colon = e.find(':');
    int c = static_cast<int>(absl::StatusCode::kUnknown);
    if (colon == std::string::npos || !absl::SimpleAtoi(e.substr(1, colon - 1), &c)) {
      c = static_cast<int>(absl::StatusCode::kUnknown);
    }
    if (code == absl::StatusCode::kOk) code = static_cast<absl::StatusCode>(c);
    const std::string msg = colon == std::string::npos ? e : e.substr(colon + 1);
    auto it = std::find_if(errors.begin(), errors.end(), [&](auto& x) { return x.first == msg; });
    if (it == errors.end()) {
      errors.emplace_back(msg, std::vector<int>{static_cast<int>(r)});
    } else {
      it->second.push_back(static_cast<int>(r));
    }
  }
  if (errors.empty()) return payloads;
  const int n = pg.size();
  std::vector<std::string> parts;
  for (auto& [msg, ranks] : errors) {
    std::string who;
    if (static_cast<int>(ranks.size()) == n && n > 1) {
      who = absl::StrCat("all ", n, " ranks");
    } else {
      who = absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "), " of ",
                         n);
    }
    parts.push_back(absl::StrCat(who, ": ", msg));
  }
  return absl::Status(code, absl::StrCat(what, ": ", absl::StrJoin(parts, "; ")));
}

// ---------------------------------------------------------------------------
// index.json (tensor/json.h reads it).

using tensor::Json;
using tensor::JsonQuote;

struct SliceRec {
  int file = 0;
  std::string tensor;
  int64_t begin = 0;
  int64_t end = 0;
  std::vector<uint32_t> crcs;  // one per crc_block elements
};

struct ParamRec {
  std::string name;
  tensor::Shape shape;
  int64_t numel = 0;
  std::vector<SliceRec> value;
  bool has_state = false;
  int64_t step = 0;
  std::map<std::string, std::vector<SliceRec>> state;  // buffer key -> slices
};

struct FileRec {
  std::string name;
  int64_t bytes = 0;
};

struct Index {
  int version = kVersion;
  std::string id;
  std::string writer;
  std::string strategy;
  int world_size = 0;
  std::vector<std::string> units;
  std::vector<FileRec> files;
  int64_t crc_block = kDefaultCrcBlock;
  std::string optimizer;
  std::vector<std::string> buffers;
  std::string lr;
  bool has_state = false;
  int64_t step = -1;
  std::vector<ParamRec> params;
  std::map<std::string, std::string> extra;

  std::map<std::string, size_t> by_name;  // filled by Validate
};

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

std::string IndexToJson(const Index& x) {
  std::string out = "{\n";
  absl::StrAppend(&out, "  \"format\": ", JsonQuote(kFormat), ",\n");
  absl::StrAppend(&out, "  \"version\": ", x.version, ",\n");
  absl::StrAppend(&out, "  \"checkpoint_id\": ", JsonQuote(x.id), ",\n");
  absl::StrAppend(&out, "  \"writer\": ", JsonQuote(x.writer), ",\n");
  absl::StrAppend(&out, "  \"strategy\": ", JsonQuote(x.strategy), ",\n");
  absl::StrAppend(&out, "  \"world_size\": ", x.world_size, ",\n");
  std::vector<std::string> units;
  for (const auto& u : x.units) units.push_back(JsonQuote(u));
  absl::StrAppend(&out, "  \"units\": [", absl::StrJoin(units, ", "), "],\n");
  std::vector<std::string> files;
  for (const auto& f : x.files) {
    files.push_back(absl::StrCat("    {\"name\": ", JsonQuote(f.name), ", \"bytes\": ", f.bytes, "}"));
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
        st.push_back(absl::StrCat("      ", JsonQuote(b), ": ",
                                  SlicesJson(it == p.state.end() ? std::vector<SliceRec>{} : it->second,
                                             "      ")));
      }
      absl::StrAppend(&s, ",\n     \"state\": {\n", absl::StrJoin(st, ",\n"), "\n     }");
    }
    s += "}";
    params.push_back(std::move(s));
  }
  absl::StrAppend(&out, "  \"params\": [\n", absl::StrJoin(params, ",\n"), "\n  ],\n");
  std::vector<std::string> extra;
  for (const auto& [k, v] : x.extra) extra.push_back(absl::StrCat("    ", JsonQuote(k), ": ", JsonQuote(v)));
  absl::StrAppend(&out, "  \"extra\": {", extra.empty() ? "" : "\n", absl::StrJoin(extra, ",\n"),
                  extra.empty() ? "" : "\n  ", "}\n}\n");
  return out;
}

// Field readers: errors name the field ("index.json: params[3].shape ...").
class Fields {
 public:
  Fields(const Json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  absl::Status Bad(const std::string& key, const std::string& what) const {
    return absl::DataLossError(absl::StrCat(where_, key.empty() ? "" : ".", key, " ", what));
  }
  absl::StatusOr<const Json*> Get(const std::string& key, Json::Kind kind, bool optional = false) const {
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

#define SC_ASSIGN(lhs, expr)              \
  do {                                    \
    auto _sc_v = (expr);                  \
    if (!_sc_v.ok()) return _sc_v.status(); \
    lhs = std::move(*_sc_v);              \
  } while (0)

#define SC_RETURN_IF_ERROR(expr)     \
  do {                               \
    absl::Status _sc_s = (expr);     \
    if (!_sc_s.ok()) return _sc_s;   \
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
    return absl::DataLossError(absl::StrCat(what, ": slices cover ", pos, " of its ", numel,
                                            " elements"));
  }
  return absl::OkStatus();
}

// Checks the index's consistency and fills by_name.
absl::Status ValidateIndex(Index& x) {
  std::set<std::string> file_names;
  for (const FileRec& f : x.files) {
    if (f.name.empty() || f.name.find('/') != std::string::npos || f.name[0] == '.' ||
        !file_names.insert(f.name).second || f.bytes < 0) {
      return absl::DataLossError(absl::StrCat("bad file entry '", f.name, "'"));
    }
  }
  if (x.crc_block <= 0) return absl::DataLossError("bad crc32c_block_elements");
  x.by_name.clear();
  for (size_t i = 0; i < x.params.size(); ++i) {
    ParamRec& p = x.params[i];
    const std::string what = absl::StrCat("parameter '", p.name, "'");
    if (!x.by_name.emplace(p.name, i).second) {
      return absl::DataLossError(absl::StrCat(what, " is listed twice"));
    }
    if (p.shape.numel() != p.numel || p.numel < 0) {
      return absl::DataLossError(absl::StrCat(what, ": numel ", p.numel, " does not match shape ",
                                              p.shape.ToString()));
    }
    SC_RETURN_IF_ERROR(CheckTiling(p.value, p.numel, x, what));
    if (p.has_state) {
      if (!x.has_state) {
        return absl::DataLossError(absl::StrCat(what, " has optimizer state but the optimizer has none"));
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
        SC_RETURN_IF_ERROR(CheckTiling(it->second, p.numel, x, absl::StrCat(what, " ", b)));
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
  if (version != kVersion) {
    return absl::InvalidArgumentError(absl::StrCat("format version ", version, " (this build reads version ",
                                                   kVersion, version > kVersion ? "; written by a newer build" : "",
                                                   ")"));
  }
  x.version = static_cast<int>(version);
  SC_ASSIGN(x.id, f.Str("checkpoint_id"));
  SC_ASSIGN(x.writer, f.Str("writer"));
  SC_ASSIGN(x.strategy, f.Str("strategy"));
  int64_t world = 0;
  SC_ASSIGN(world, f.Int("world_size"));
  x.world_size = static_cast<int>(world);
  const Json* units = nullptr;
  SC_ASSIGN(units, f.Get("units", Json::Kind::kArray));
  for (const Json& u : units->items) x.units.push_back(u.text);
  const Json* files = nullptr;
  SC_ASSIGN(files, f.Get("files", Json::Kind::kArray));
  for (size_t i = 0; i < files->items.size(); ++i) {
    if (files->items[i].kind != Json::Kind::kObject) return absl::DataLossError("files[] entry is not an object");
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
    for (const Json& d : shape->items) {
      int64_t v = 0;
      if (d.kind != Json::Kind::kNumber || !absl::SimpleAtoi(d.text, &v) || v < 0) {
        return absl::DataLossError(absl::StrCat(where, ".shape is not a shape"));
      }
      p.shape.push_back(v);
    }
    SC_ASSIGN(p.numel, fp.Int("numel"));
    std::string dtype;
    SC_ASSIGN(dtype, fp.Str("dtype"));
    if (dtype != "F32") return absl::DataLossError(absl::StrCat(where, ".dtype is ", dtype, ", expected F32"));
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
  const Json* extra = nullptr;
  SC_ASSIGN(extra, f.Get("extra", Json::Kind::kObject));
  for (const auto& [k, v] : extra->fields) {
    if (v.kind != Json::Kind::kString) return absl::DataLossError("extra values must be strings");
    x.extra[k] = v.text;
  }
  SC_RETURN_IF_ERROR(ValidateIndex(x));
  return x;
}

// Reads and parses <dir>/index.json; errors name the folder or the file.
absl::StatusOr<Index> ReadIndex(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("checkpoint folder '", dir, "' does not exist"));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("'", dir, "' is not a folder"));
  }
  const std::string path = absl::StrCat(dir, "/", kIndexFile);
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(
        "'", path, "' is missing: not a sharded checkpoint, or written by a world that did not "
        "finish its save (shard files without index.json are never valid)"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::UnavailableError(absl::StrCat("cannot read '", path, "'"));
  absl::StatusOr<Index> x = ParseIndex(ss.str());
  if (!x.ok()) {
    return absl::Status(x.status().code(),
                        absl::StrCat("'", path, "' is invalid: ", x.status().message()));
  }
  return x;
}

// ---------------------------------------------------------------------------
// Files.

absl::Status ErrnoStatus(const std::string& what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(what, " '", path, "': ", std::strerror(errno)));
}

void FsyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

absl::Status WriteFileDurably(const std::string& path, const std::string& text) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("cannot create", tmp);
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = ErrnoStatus("cannot write", tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return s;
    }
    p += n;
    left -= n;
  }
  if (::fsync(fd) != 0) {
    absl::Status s = ErrnoStatus("cannot fsync", tmp);
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status s = ErrnoStatus("cannot rename onto", path);
    ::unlink(tmp.c_str());
    return s;
  }
  return absl::OkStatus();
}

std::string ShardFileName(int r, int n) { return absl::StrCat("shard_", r, "_of_", n, ".safetensors"); }

// Whether `name` is one of the files a sharded checkpoint folder holds.
bool IsCheckpointFile(const std::string& name) {
  if (name == kIndexFile) return true;
  if (absl::StartsWith(name, "index.json.tmp.")) return true;
  int r = 0, n = 0;
  char tail[32] = {0};
  if (std::sscanf(name.c_str(), "shard_%d_of_%d.safetenso%31s", &r, &n, tail) == 3) {
    return std::string(tail) == "rs" || absl::StartsWith(std::string(tail), "rs.tmp.");
  }
  return false;
}

// OK when `dir` does not exist, or is a folder that holds nothing but a
// sharded checkpoint's files (so replacing it loses nothing else).
absl::Status CheckReplaceable(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoStatus("cannot stat", dir);
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("refusing to replace '", dir, "': it exists and is not a folder"));
  }
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoStatus("cannot list", dir);
  std::string stray;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    if (!IsCheckpointFile(name)) {
      stray = name;
      break;
    }
  }
  ::closedir(d);
  if (!stray.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to replace '", dir, "': it holds '", stray,
        "', which is not part of a sharded checkpoint (save into a new or empty folder)"));
  }
  return absl::OkStatus();
}

void RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

// Moves the finished folder `tmp` onto `dir` (replacing a previous checkpoint
// atomically when the filesystem supports RENAME_EXCHANGE).
absl::Status Publish(const std::string& tmp, const std::string& dir, const std::string& id) {
  SC_RETURN_IF_ERROR(CheckReplaceable(dir));
  if (::rename(tmp.c_str(), dir.c_str()) == 0) return absl::OkStatus();
  if (errno != EEXIST && errno != ENOTEMPTY) return ErrnoStatus("cannot rename a checkpoint onto", dir);
  // `dir` holds an older checkpoint: swap the two folders, then drop the old one.
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    RemoveTree(tmp);
    return absl::OkStatus();
  }
  // No RENAME_EXCHANGE here: two renames (a crash between them leaves the old
  // checkpoint in "<dir>.old-<id>" and no `dir`).
  const std::string old = absl::StrCat(dir, ".old-", id);
  if (::rename(dir.c_str(), old.c_str()) != 0) return ErrnoStatus("cannot move aside", dir);
  if (::rename(tmp.c_str(), dir.c_str()) != 0) {
    absl::Status s = ErrnoStatus("cannot rename a checkpoint onto", dir);
    ::rename(old.c_str(), dir.c_str());
    return s;
  }
  RemoveTree(old);
  return absl::OkStatus();
}

std::string ParentOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string StripTrailingSlashes(std::string s) {
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

// Reads stored slices, checking each file (size, checkpoint id) once and each
// checksum block it reads.
class SliceReader {
 public:
  SliceReader(const std::string& dir, const Index& index) : dir_(dir), index_(index) {}

  // Elements [lo, hi) of the parameter (or buffer) that `s` belongs to (lo, hi
  // within [s.begin, s.end)) into `out` (hi - lo elements, f32, contiguous).
  absl::Status Read(const SliceRec& s, int64_t lo, int64_t hi, Tensor out) {
    const tensor::SafetensorsHeader* header = nullptr;
    SC_ASSIGN(header, Header(s.file));
    const std::string path = Path(s.file);
    const tensor::SafetensorsEntry* e = header->Find(s.tensor);
    if (e == nullptr) {
      return absl::DataLossError(
          absl::StrCat("'", path, "' lacks tensor '", s.tensor, "' that index.json lists"));
    }
    if (e->dtype != tensor::Dtype::kF32 || e->shape.numel() != s.end - s.begin) {
      return absl::DataLossError(absl::StrCat("'", path, "': tensor '", s.tensor, "' is ",
                                              tensor::DtypeName(e->dtype), " ", e->shape.ToString(),
                                              ", index.json records f32 of ", s.end - s.begin,
                                              " elements"));
    }
    // Read whole checksum blocks around [lo, hi).
    const int64_t block = index_.crc_block;
    const int64_t first = (lo - s.begin) / block;
    const int64_t last = (hi - s.begin + block - 1) / block;  // exclusive
    const int64_t rb = first * block;
    const int64_t re = std::min(last * block, s.end - s.begin);
    Tensor raw;
    {
      tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kTemporaries);
      raw = Tensor::Empty({re - rb}, tensor::Dtype::kF32);
    }
    SC_RETURN_IF_ERROR(tensor::ReadSafetensorsSlice(path, *header, s.tensor, rb, raw));
    for (int64_t b = first; b < last; ++b) {
      const int64_t bb = b * block - rb;
      const int64_t be = std::min((b + 1) * block, s.end - s.begin) - rb;
      const uint32_t crc = tensor::Crc32c(raw.data<float>() + bb, (be - bb) * 4);
      if (crc != s.crcs[b]) {
        return absl::DataLossError(absl::StrCat(
            "'", path, "' is corrupted: tensor '", s.tensor, "' elements [", rb + bb, ", ", rb + be,
            ") have checksum ", Hex32(crc), " but index.json records ", Hex32(s.crcs[b])));
      }
    }
    out.CopyFrom(raw.Narrow(0, lo - s.begin - rb, hi - lo));
    return absl::OkStatus();
  }

  // Fills out (hi - lo elements) with elements [lo, hi) of the tensor stored
  // as `slices` (which tile it).
  absl::Status ReadRange(const std::vector<SliceRec>& slices, int64_t lo, int64_t hi, Tensor out) {
    for (const SliceRec& s : slices) {
      const int64_t a = std::max(lo, s.begin);
      const int64_t b = std::min(hi, s.end);
      if (a >= b) continue;
      SC_RETURN_IF_ERROR(Read(s, a, b, out.Narrow(0, a - lo, b - a)));
    }
    return absl::OkStatus();
  }

 private:
  std::string Path(int file) const { return absl::StrCat(dir_, "/", index_.files[file].name); }

  absl::StatusOr<const tensor::SafetensorsHeader*> Header(int file) {
    auto it = headers_.find(file);
    if (it != headers_.end()) return &it->second;
    const std::string path = Path(file);
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      if (errno == ENOENT) {
        return absl::NotFoundError(
            absl::StrCat("shard file '", path, "' is missing (index.json lists it)"));
      }
      return ErrnoStatus("cannot stat", path);
    }
    const FileRec& rec = index_.files[file];
    if (st.st_size != rec.bytes) {
      return absl::DataLossError(absl::StrCat(
          "'", path, "' has ", static_cast<int64_t>(st.st_size), " bytes but index.json records ",
          rec.bytes, st.st_size < rec.bytes ? " (truncated)" : " (replaced or appended to)"));
    }
    absl::StatusOr<tensor::SafetensorsHeader> h = tensor::ReadSafetensorsHeader(path);
    if (!h.ok()) return h.status();
    auto id = h->metadata.find(kIdKey);
    if (id == h->metadata.end() || id->second != index_.id) {
      return absl::DataLossError(absl::StrCat(
          "'", path, "' belongs to another checkpoint (id ",
          id == h->metadata.end() ? std::string("none") : id->second, ", index.json has ",
          index_.id, ")"));
    }
    return &headers_.emplace(file, std::move(*h)).first->second;
  }

  std::string dir_;
  const Index& index_;
  std::map<int, tensor::SafetensorsHeader> headers_;
};

// ---------------------------------------------------------------------------
// What a rank holds: one or more flat buffers over original parameters.

struct FlatLayout {
  struct Entry {
    std::string name;
    tensor::Shape shape;
    int64_t offset = 0;  // in the flat buffer
    int64_t numel = 0;
  };
  std::string ref;  // the optimizer state's name
  std::vector<Entry> entries;
  int64_t shard_begin = 0;
  int64_t shard_numel = 0;
  Tensor shard;              // fp32 (shard_numel), contiguous; written in place by Load
  optim::ParamRef param_ref;  // for Optimizer::LoadStateTensors
};

struct Participant {
  std::string writer;
  std::string strategy;
  std::vector<std::string> units;
  std::vector<FlatLayout> layouts;
  bool writes = false;
  int file_index = 0;
  int num_files = 1;
};

// Save phase 1 on a writing rank: the shard file, and a manifest of what it
// holds (tab-separated lines):
//   F <file index> <file name> <bytes>
//   R <ref> <step or -1>
//   T <param> <step>
//   S <kind> <param> <begin> <end> <tensor> <crc>[,<crc>...]
absl::StatusOr<std::string> WriteShard(const std::string& tmp_dir, const Participant& p,
                                       const optim::Optimizer& opt, const std::string& id,
                                       int64_t crc_block, int rank) {
  const std::vector<std::string> keys = opt.BufferNames();
  std::map<std::string, Tensor> state;
  for (auto& [name, t] : opt.StateTensors()) state[name] = t;
  tensor::NamedTensors tensors;
  std::string manifest;
  auto add = [&](const std::string& kind, const std::string& param, int64_t begin, const Tensor& t) {
    const std::string name = kind == kValueKind ? absl::StrCat("model/", param, "@", begin)
                                                : absl::StrCat("optim/", kind, "/", param, "@", begin);
    const int64_t n = t.numel();
    std::vector<std::string> crcs;
    for (int64_t b = 0; b < n; b += crc_block) {
      crcs.push_back(Hex32(tensor::Crc32c(t.data<float>() + b, std::min(crc_block, n - b) * 4)));
    }
    absl::StrAppend(&manifest, "S\t", kind, "\t", param, "\t", begin, "\t", begin + n, "\t", name,
                    "\t", absl::StrJoin(crcs, ","), "\n");
    tensors.emplace_back(name, t);
  };
  for (const FlatLayout& L : p.layouts) {
    const bool has = opt.HasState(L.ref);
    std::vector<Tensor> bufs;
    if (has) {
      for (const std::string& k : keys) {
        auto it = state.find(absl::StrCat(L.ref, ".", k));
        if (it == state.end()) {
          return absl::InternalError(absl::StrCat("optimizer state '", L.ref, ".", k, "' is missing"));
        }
        const Tensor& t = it->second;
        if (t.dtype() != tensor::Dtype::kF32 || t.numel() != L.shard_numel || !t.is_contiguous()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "optimizer state '", L.ref, ".", k, "' has shape ", t.shape().ToString(),
              " but the shard has ", L.shard_numel, " elements (an optimizer of another model?)"));
        }
        bufs.push_back(t.Reshape({L.shard_numel}));
      }
    }
    const int64_t step = has ? opt.StepCount(L.ref) : -1;
    absl::StrAppend(&manifest, "R\t", L.ref, "\t", step, "\n");
    const int64_t sb = L.shard_begin;
    const int64_t se = L.shard_begin + L.shard_numel;
    for (const FlatLayout::Entry& e : L.entries) {
      const int64_t lo = std::max(sb, e.offset);
      const int64_t hi = std::min(se, e.offset + e.numel);
      if (lo >= hi) continue;
      add(kValueKind, e.name, lo - e.offset, L.shard.Narrow(0, lo - sb, hi - lo));
      for (size_t k = 0; k < bufs.size(); ++k) {
        add(keys[k], e.name, lo - e.offset, bufs[k].Narrow(0, lo - sb, hi - lo));
      }
      if (has) absl::StrAppend(&manifest, "T\t", e.name, "\t", step, "\n");
    }
  }
  {
    std::function<absl::Status(int)> fault;
    {
      std::lock_guard<std::mutex> lock(g_hooks_mu);
      fault = g_write_fault;
    }
    if (fault) SC_RETURN_IF_ERROR(fault(rank));
  }
  const std::string file = ShardFileName(p.file_index, p.num_files);
  const std::string path = absl::StrCat(tmp_dir, "/", file);
  SC_RETURN_IF_ERROR(tensor::WriteSafetensors(
      path, tensors, {{kIdKey, id}, {kShardKey, absl::StrCat(p.file_index, "/", p.num_files)}}));
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus("cannot stat", path);
  return absl::StrCat("F\t", p.file_index, "\t", file, "\t", static_cast<int64_t>(st.st_size), "\n",
                      manifest);
}

// Rank 0: the index from every writer's manifest and this rank's view of the
// parameters (every rank knows every parameter's name and shape).
absl::StatusOr<Index> AssembleIndex(const Participant& p, const optim::Optimizer& opt,
                                    const std::vector<std::string>& manifests, int world_size,
                                    const std::string& id, int64_t crc_block,
                                    const std::map<std::string, std::string>& extra) {
  Index x;
  x.id = id;
  x.writer = p.writer;
  x.strategy = p.strategy;
  x.world_size = world_size;
  x.units = p.units;
  x.crc_block = crc_block;
  x.optimizer = opt.name();
  x.buffers = opt.BufferNames();
  x.lr = absl::StrFormat("%.17g", opt.lr());
  x.extra = extra;
  x.files.resize(p.num_files);
  std::vector<bool> seen_file(p.num_files, false);
  std::map<std::string, size_t> pos;
  for (const FlatLayout& L : p.layouts) {
    for (const FlatLayout::Entry& e : L.entries) {
      if (pos.count(e.name)) return absl::InternalError(absl::StrCat("parameter '", e.name, "' is in two units"));
      pos[e.name] = x.params.size();
      ParamRec r;
      r.name = e.name;
      r.shape = e.shape;
      r.numel = e.numel;
      x.params.push_back(std::move(r));
    }
  }
  std::set<int64_t> ref_steps;
  bool any_state = false;
  std::map<std::string, std::set<int64_t>> param_steps;
  for (size_t r = 0; r < manifests.size(); ++r) {
    int file = -1;
    for (absl::string_view line : absl::StrSplit(manifests[r], '\n', absl::SkipEmpty())) {
      std::vector<std::string> f = absl::StrSplit(line, '\t');
      auto bad = [&] {
        return absl::InternalError(absl::StrCat("rank ", r, " sent a bad manifest line '", line, "'"));
      };
      if (f[0] == "F" && f.size() == 4) {
        int64_t bytes = 0;
        if (!absl::SimpleAtoi(f[1], &file) || file < 0 || file >= p.num_files || seen_file[file] ||
            !absl::SimpleAtoi(f[3], &bytes)) {
          return bad();
        }
        seen_file[file] = true;
        x.files[file] = FileRec{f[2], bytes};
      } else if (f[0] == "R" && f.size() == 3) {
        int64_t step = 0;
        if (!absl::SimpleAtoi(f[2], &step)) return bad();
        if (step >= 0) {
          any_state = true;
          ref_steps.insert(step);
        }
      } else if (f[0] == "T" && f.size() == 3) {
        int64_t step = 0;
        if (!absl::SimpleAtoi(f[2], &step) || pos.count(f[1]) == 0) return bad();
        param_steps[f[1]].insert(step);
      } else if (f[0] == "S" && f.size() == 7 && file >= 0) {
        auto it = pos.find(f[2]);
        SliceRec s;
        s.file = file;
        s.tensor = f[5];
        if (it == pos.end() || !absl::SimpleAtoi(f[3], &s.begin) || !absl::SimpleAtoi(f[4], &s.end)) {
          return bad();
        }
        for (absl::string_view c : absl::StrSplit(f[6], ',', absl::SkipEmpty())) {
          uint32_t v = 0;
          if (!absl::SimpleHexAtoi(c, &v)) return bad();
          s.crcs.push_back(v);
        }
        ParamRec& rec = x.params[it->second];
        if (f[1] == kValueKind) {
          rec.value.push_back(std::move(s));
        } else {
          rec.state[f[1]].push_back(std::move(s));
        }
      } else {
        return bad();
      }
    }
  }
  for (int i = 0; i < p.num_files; ++i) {
    if (!seen_file[i]) return absl::InternalError(absl::StrCat("no rank wrote shard file ", i));
  }
  x.has_state = any_state;
  x.step = ref_steps.size() == 1 ? *ref_steps.begin() : -1;
  for (ParamRec& rec : x.params) {
    auto it = param_steps.find(rec.name);
    if (it == param_steps.end()) continue;
    if (it->second.size() != 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the ranks holding parameter '", rec.name, "' disagree on its optimizer step (",
          absl::StrJoin(it->second, ", "), ")"));
    }
    rec.has_state = true;
    rec.step = *it->second.begin();
  }
  absl::Status s = ValidateIndex(x);
  if (!s.ok()) {
    return absl::InternalError(absl::StrCat("the ranks' shards do not form a checkpoint: ", s.message()));
  }
  return x;
}

int64_t CrcBlockForSave();

absl::Status SaveImpl(const std::string& dir_in, const Participant& p, const optim::Optimizer& opt,
                      ProcessGroup& pg, const std::map<std::string, std::string>& extra) {
  const std::string dir = StripTrailingSlashes(dir_in);
  const std::string what = absl::StrCat("save_sharded '", dir, "'");
  const int rank = pg.rank();
  const int64_t crc_block = CrcBlockForSave();

  // Phase 0 (rank 0): check the target, create "<dir>.tmp-<id>", share the id.
  std::string id;
  absl::Status s;
  if (rank == 0) {
    std::random_device rd;
    const uint64_t hi = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    const uint64_t lo = static_cast<uint64_t>(
        std::chrono::system_clock::now().time_since_epoch().count());
    id = absl::StrFormat("%016x%08x", hi ^ lo, static_cast<uint32_t>(::getpid()));
    if (dir.empty()) s = absl::InvalidArgumentError("the checkpoint folder name is empty");
    if (s.ok()) s = CheckReplaceable(dir);
    if (s.ok()) {
      std::error_code ec;
      std::filesystem::create_directories(ParentOf(dir), ec);
      if (ec) {
        s = absl::UnavailableError(
            absl::StrCat("cannot create '", ParentOf(dir), "': ", ec.message()));
      }
    }
    if (s.ok() && ::mkdir(absl::StrCat(dir, ".tmp-", id).c_str(), 0755) != 0) {
      s = ErrnoStatus("cannot create", absl::StrCat(dir, ".tmp-", id));
    }
  }
  absl::StatusOr<std::vector<std::string>> got = Exchange(pg, s, id, what);
  if (!got.ok()) {
    if (rank == 0 && s.ok()) RemoveTree(absl::StrCat(dir, ".tmp-", id));
    return got.status();
  }
  id = (*got)[0];
  const std::string tmp = absl::StrCat(dir, ".tmp-", id);

  // Phase 1: writers write their shard files.
  std::string manifest;
  s = absl::OkStatus();
  if (p.writes) {
    absl::StatusOr<std::string> m = WriteShard(tmp, p, opt, id, crc_block, rank);
    if (m.ok()) {
      manifest = std::move(*m);
    } else {
      s = m.status();
    }
  }
  got = Exchange(pg, s, manifest, what);
  if (!got.ok()) {
    if (rank == 0) RemoveTree(tmp);
    return got.status();
  }

  // Phase 2 (rank 0): index.json, then the folder goes live.
  s = absl::OkStatus();
  if (rank == 0) {
    absl::StatusOr<Index> index = AssembleIndex(p, opt, *got, pg.size(), id, crc_block, extra);
    if (!index.ok()) s = index.status();
    if (s.ok()) s = WriteFileDurably(absl::StrCat(tmp, "/", kIndexFile), IndexToJson(*index));
    if (s.ok()) {
      FsyncDir(tmp);
      s = Publish(tmp, dir, id);
    }
    if (s.ok()) {
      FsyncDir(ParentOf(dir));
    } else {
      RemoveTree(tmp);
    }
  }
  // Also the final barrier: no rank returns before the checkpoint is live.
  got = Exchange(pg, s, "", what);
  return got.ok() ? absl::OkStatus() : got.status();
}

// Load phase 1 on every rank: everything this rank will hold, in staging
// buffers, checked against the model and the optimizer.
struct Staged {
  std::vector<Tensor> values;                // per layout
  std::vector<std::vector<Tensor>> buffers;  // per layout, per key (empty: no state)
  std::vector<int64_t> steps;                // per layout
  bool any_state = false;
};

absl::StatusOr<Staged> Stage(const std::string& dir, const Index& x, const Participant& p,
                             const optim::Optimizer& opt, const ShardedLoadOptions& options) {
  // The model's parameters against the checkpoint's.
  std::vector<std::string> missing, shape_errors;
  std::set<std::string> model_names;
  for (const FlatLayout& L : p.layouts) {
    for (const FlatLayout::Entry& e : L.entries) {
      model_names.insert(e.name);
      auto it = x.by_name.find(e.name);
      if (it == x.by_name.end()) {
        missing.push_back(e.name);
      } else if (x.params[it->second].shape != e.shape) {
        shape_errors.push_back(absl::StrCat("'", e.name, "' is ", x.params[it->second].shape.ToString(),
                                            " in the checkpoint but ", e.shape.ToString(),
                                            " in the model"));
      }
    }
  }
  auto first_few = [](const std::vector<std::string>& v) {
    std::vector<std::string> head(v.begin(), v.begin() + std::min<size_t>(v.size(), 5));
    return absl::StrCat(absl::StrJoin(head, ", "), v.size() > 5 ? absl::StrCat(", ... (", v.size(), " in all)") : "");
  };
  if (!missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameters of the model missing from the checkpoint: ", first_few(missing)));
  }
  std::vector<std::string> unexpected;
  for (const ParamRec& r : x.params) {
    if (model_names.count(r.name) == 0) unexpected.push_back(r.name);
  }
  if (!unexpected.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameters in the checkpoint that the model lacks: ", first_few(unexpected)));
  }
  if (!shape_errors.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("shape mismatch: ", first_few(shape_errors)));
  }
  const bool load_opt = options.load_optimizer_state;
  if (load_opt) {
    const std::vector<std::string> keys = opt.BufferNames();
    if (x.optimizer != opt.name() || x.buffers != keys) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the checkpoint's optimizer state is ", x.optimizer, " (", absl::StrJoin(x.buffers, ", "),
          ") but the optimizer is ", opt.name(), " (", absl::StrJoin(keys, ", "),
          "); load with load_optimizer_state = false to take the model only"));
    }
  }

  // Each layout's optimizer step: its parameters' common step.
  Staged st;
  std::vector<bool> has(p.layouts.size(), false);
  if (load_opt) {
    int with = 0;
    for (size_t i = 0; i < p.layouts.size(); ++i) {
      const FlatLayout& L = p.layouts[i];
      std::string first_name;
      int64_t step = -1;
      bool seen = false, state = false;
      for (const FlatLayout::Entry& e : L.entries) {
        if (e.numel == 0) continue;
        const ParamRec& r = x.params[x.by_name.at(e.name)];
        if (!seen) {
          seen = true;
          state = r.has_state;
          step = r.step;
          first_name = e.name;
          continue;
        }
        if (r.has_state != state) {
          return absl::FailedPreconditionError(absl::StrCat(
              "cannot form the optimizer state of '", L.ref, "': parameter '",
              state ? first_name : e.name, "' has optimizer state in the checkpoint but '",
              state ? e.name : first_name, "' has none"));
        }
        if (state && r.step != step) {
          return absl::FailedPreconditionError(absl::StrCat(
              "cannot form the optimizer state of '", L.ref, "': parameters '", first_name,
              "' (step ", step, ") and '", e.name, "' (step ", r.step,
              ") were stepped a different number of times"));
        }
      }
      if (!seen) {  // a flat buffer without elements: the checkpoint's common step
        state = x.has_state;
        step = x.step;
        if (state && step < 0) {
          return absl::FailedPreconditionError(absl::StrCat(
              "cannot form the optimizer state of '", L.ref,
              "' (no parameters): the checkpoint's parameters have different step counts"));
        }
      }
      has[i] = state;
      st.steps.push_back(state ? step : 0);
      with += state ? 1 : 0;
    }
    if (with != 0 && with != static_cast<int>(p.layouts.size())) {
      return absl::FailedPreconditionError(
          "the checkpoint holds optimizer state for some flat parameters only");
    }
    st.any_state = with > 0;
  }

  // Read what overlaps this rank's shards.
  SliceReader reader(dir, x);
  const std::vector<std::string> keys = opt.BufferNames();
  tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kTemporaries);
  for (size_t i = 0; i < p.layouts.size(); ++i) {
    const FlatLayout& L = p.layouts[i];
    st.values.push_back(Tensor::Zeros({L.shard_numel}));
    st.buffers.emplace_back();
    if (has[i]) {
      for (size_t k = 0; k < keys.size(); ++k) st.buffers.back().push_back(Tensor::Zeros({L.shard_numel}));
    }
    const int64_t sb = L.shard_begin;
    const int64_t se = L.shard_begin + L.shard_numel;
    for (const FlatLayout::Entry& e : L.entries) {
      const int64_t lo = std::max(sb, e.offset);
      const int64_t hi = std::min(se, e.offset + e.numel);
      if (lo >= hi) continue;
      const ParamRec& r = x.params[x.by_name.at(e.name)];
      SC_RETURN_IF_ERROR(reader.ReadRange(r.value, lo - e.offset, hi - e.offset,
                                          st.values[i].Narrow(0, lo - sb, hi - lo)));
      for (size_t k = 0; k < st.buffers[i].size(); ++k) {
        SC_RETURN_IF_ERROR(reader.ReadRange(r.state.at(keys[k]), lo - e.offset, hi - e.offset,
                                            st.buffers[i][k].Narrow(0, lo - sb, hi - lo)));
      }
    }
  }
  return st;
}

// Load phase 2: nothing of the checks can fail any more.
absl::Status Commit(Participant& p, Staged& st, optim::Optimizer& opt,
                    const ShardedLoadOptions& options) {
  if (options.load_optimizer_state) {
    if (st.any_state) {
      const std::vector<std::string> keys = opt.BufferNames();
      optim::NamedTensors named;
      std::vector<optim::ParamRef> refs;
      for (size_t i = 0; i < p.layouts.size(); ++i) {
        const FlatLayout& L = p.layouts[i];
        const int64_t step = st.steps[i];
        named.emplace_back(absl::StrCat(L.ref, ".step"),
                           Tensor::FromData<int64_t>(absl::MakeConstSpan(&step, 1), {1}));
        for (size_t k = 0; k < keys.size(); ++k) {
          named.emplace_back(absl::StrCat(L.ref, ".", keys[k]),
                             st.buffers[i][k].Reshape(L.param_ref.param.shape()));
        }
        refs.push_back(L.param_ref);
      }
      absl::Status s;
      {
        tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kOptimizerState);
        s = opt.LoadStateTensors(named, refs);
      }
      if (!s.ok()) return s;
    } else {
      opt.ClearState();
    }
  }
  for (size_t i = 0; i < p.layouts.size(); ++i) {
    Tensor dst = p.layouts[i].shard;
    dst.CopyFrom(st.values[i].Reshape(dst.shape()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, std::string>> LoadImpl(
    const std::string& dir_in, Participant& p, optim::Optimizer& opt, ProcessGroup& pg,
    const ShardedLoadOptions& options, const std::function<absl::Status()>& after_commit) {
  const std::string dir = StripTrailingSlashes(dir_in);
  const std::string what = absl::StrCat("load_sharded '", dir, "'");
  absl::StatusOr<Index> index = ReadIndex(dir);
  absl::StatusOr<Staged> staged =
      index.ok() ? Stage(dir, *index, p, opt, options) : absl::StatusOr<Staged>(index.status());
  absl::StatusOr<std::vector<std::string>> got = Exchange(pg, staged.status(), "", what);
  if (!got.ok()) return got.status();
  absl::Status s = Commit(p, *staged, opt, options);
  got = Exchange(pg, s, "", absl::StrCat(what, " (the ranks may now disagree on the state)"));
  if (!got.ok()) return got.status();
  if (after_commit) {
    s = after_commit();
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  }
  return index->extra;
}

Participant FromFsdp(FullyShardedModel& fsdp) {
  Participant p;
  p.writer = "fsdp";
  p.strategy = ShardingStrategyName(fsdp.strategy());
  p.writes = fsdp.replica_index() == 0;
  p.file_index = fsdp.shard_group_rank();
  p.num_files = fsdp.shard_group_size();
  std::vector<optim::ParamRef> refs = fsdp.ParamRefs();
  for (int i = 0; i < fsdp.num_units(); ++i) {
    const FlatParameter& flat = fsdp.flat_param(i);
    FlatLayout L;
    L.ref = fsdp.param_ref_name(i);
    for (const FlatParameter::Entry& e : flat.entries()) {
      L.entries.push_back({e.name, e.param->shape, e.offset, e.numel});
    }
    L.shard_begin = flat.shard_begin();
    L.shard_numel = flat.shard_numel();
    L.shard = flat.shard();
    L.param_ref = refs.at(i);
    p.units.push_back(fsdp.unit_name(i));
    p.layouts.push_back(std::move(L));
  }
  return p;
}

absl::Status CheckFsdpGroup(FullyShardedModel& fsdp, ProcessGroup& pg) {
  if (fsdp.shard_group_size() * fsdp.num_replicas() != pg.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the process group has ", pg.size(), " ranks but the model is sharded ",
        fsdp.shard_group_size(), " ways with ", fsdp.num_replicas(), " replicas"));
  }
  return absl::OkStatus();
}

constexpr char kZero1Ref[] = "zero1.shard";

Participant FromZero1(Zero1& zero, ProcessGroup& pg) {
  Participant p;
  p.writer = "zero1";
  p.strategy = "ZERO1";
  p.units = {kZero1Ref};
  p.writes = true;
  p.file_index = pg.rank();
  p.num_files = pg.size();
  FlatLayout L;
  L.ref = kZero1Ref;
  int64_t offset = 0;
  for (auto& [name, param] : zero.module().NamedParameters()) {
    L.entries.push_back({name, param->shape, offset, param->numel()});
    offset += param->numel();
  }
  L.shard_begin = zero.shard_begin();
  L.shard_numel = zero.shard_numel();
  L.shard = zero.master_shard();
  L.param_ref.name = kZero1Ref;
  L.param_ref.param = zero.master_shard();
  L.param_ref.grad = zero.grad_shard();
  L.param_ref.decay_ranges = zero.shard_decay_ranges();
  p.layouts.push_back(std::move(L));
  return p;
}

absl::Status CheckZero1Group(Zero1& zero, ProcessGroup& pg) {
  if (zero.shard_numel() * pg.size() != zero.padded_numel() ||
      zero.shard_begin() != zero.shard_numel() * pg.rank()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the process group (rank ", pg.rank(), " of ", pg.size(),
        ") is not the one this Zero1 shards over (shard [", zero.shard_begin(), ", ",
        zero.shard_begin() + zero.shard_numel(), ") of ", zero.padded_numel(), ")"));
  }
  return absl::OkStatus();
}

// After loading the master shards: every rank's full parameters, as
// Zero1::Step refreshes them (all-gather of the master shards).
absl::Status RefreshZero1Params(Zero1& zero, ProcessGroup& pg) {
  Tensor full;
  {
    tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kCommunication);
    full = Tensor::Empty({zero.padded_numel()}, tensor::Dtype::kF32);
  }
  absl::Status s = pg.AllGatherSync(zero.master_shard(), full);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("all-gather of the master shards: ", s.message()));
  int64_t offset = 0;
  for (auto& [name, param] : zero.module().NamedParameters()) {
    param->value.CopyFrom(full.Narrow(0, offset, param->numel()).View(param->shape));
    offset += param->numel();
  }
  return absl::OkStatus();
}

std::mutex g_block_mu;
int64_t g_crc_block = kDefaultCrcBlock;  // guarded by g_block_mu

int64_t CrcBlockForSave() {
  std::lock_guard<std::mutex> lock(g_block_mu);
  return g_crc_block;
}

}  // namespace

namespace internal {
void SetShardWriteFaultForTesting(std::function<absl::Status(int rank)> fault) {
  std::lock_guard<std::mutex> lock(g_hooks_mu);
  g_write_fault = std::move(fault);
}
void SetCrcBlockElementsForTesting(int64_t elements) {
  std::lock_guard<std::mutex> lock(g_block_mu);
  g_crc_block = elements > 0 ? elements : kDefaultCrcBlock;
}
}  // namespace internal

absl::Status SaveSharded(const std::string& dir, FullyShardedModel& fsdp,
                         const optim::Optimizer& optimizer, ProcessGroup& pg,
                         const std::map<std::string, std::string>& extra) {
  SC_RETURN_IF_ERROR(CheckFsdpGroup(fsdp, pg));
  return SaveImpl(dir, FromFsdp(fsdp), optimizer, pg, extra);
}

absl::StatusOr<std::map<std::string, std::string>> LoadSharded(
    const std::string& dir, FullyShardedModel& fsdp, optim::Optimizer& optimizer,
    ProcessGroup& pg, const ShardedLoadOptions& options) {
  SC_RETURN_IF_ERROR(CheckFsdpGroup(fsdp, pg));
  Participant p = FromFsdp(fsdp);
  return LoadImpl(dir, p, optimizer, pg, options, nullptr);
}

absl::Status SaveSharded(const std::string& dir, Zero1& zero, ProcessGroup& pg,
                         const std::map<std::string, std::string>& extra) {
  SC_RETURN_IF_ERROR(CheckZero1Group(zero, pg));
  return SaveImpl(dir, FromZero1(zero, pg), zero.optimizer(), pg, extra);
}

absl::StatusOr<std::map<std::string, std::string>> LoadSharded(const std::string& dir, Zero1& zero,
                                                               ProcessGroup& pg,
                                                               const ShardedLoadOptions& options) {
  SC_RETURN_IF_ERROR(CheckZero1Group(zero, pg));
  Participant p = FromZero1(zero, pg);
  return LoadImpl(dir, p, zero.optimizer(), pg, options,
                  [&zero, &pg] { return RefreshZero1Params(zero, pg); });
}

absl::StatusOr<ShardedCheckpointInfo> ReadShardedCheckpointInfo(const std::string& dir) {
  absl::StatusOr<Index> x = ReadIndex(StripTrailingSlashes(dir));
  if (!x.ok()) return x.status();
  ShardedCheckpointInfo info;
  info.format_version = x->version;
  info.checkpoint_id = x->id;
  info.writer = x->writer;
  info.strategy = x->strategy;
  info.world_size = x->world_size;
  info.num_files = static_cast<int>(x->files.size());
  info.units = x->units;
  info.optimizer = x->optimizer;
  info.optimizer_buffers = x->buffers;
  info.has_optimizer_state = x->has_state;
  info.optimizer_step = x->has_state ? x->step : -1;
  for (const ParamRec& p : x->params) info.params.emplace_back(p.name, p.shape);
  info.extra = x->extra;
  return info;
}

}  // namespace dist
