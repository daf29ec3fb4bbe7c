// safetensors reader and writer (the header is JSON: tensor/json.h).
#include "tensor/safetensors.h"

#include <fcntl.h>
#include <nmmintrin.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tensor/durable_file.h"
#include "tensor/json.h"

namespace tensor {
namespace {

constexpr char kChecksumKey[] = "fsdp.crc32c";
constexpr char kHeaderChecksumKey[] = "fsdp.header_crc32c";
constexpr int64_t kMaxHeaderBytes = 100 << 20;
// A header of 100 MiB could hold ~50M JSON values (some 5 GB parsed): allow
// 4M (enough for ~400k tensors) and tensors of at most 64 dims.
constexpr int64_t kMaxHeaderValues = int64_t{1} << 22;
constexpr int kMaxRank = 64;

const char* SafetensorsDtypeName(Dtype d) {
  switch (d) {
    case Dtype::kF32: return "F32";
    case Dtype::kF16: return "F16";
    case Dtype::kBF16: return "BF16";
    case Dtype::kI32: return "I32";
    case Dtype::kI64: return "I64";
    case Dtype::kU8: return "U8";
  }
  return "?";
}

absl::StatusOr<Dtype> DtypeFromSafetensorsName(const std::string& s) {
  if (s == "F32") return Dtype::kF32;
  if (s == "F16") return Dtype::kF16;
  if (s == "BF16") return Dtype::kBF16;
  if (s == "I32") return Dtype::kI32;
  if (s == "I64") return Dtype::kI64;
  if (s == "U8") return Dtype::kU8;
  return absl::InvalidArgumentError(absl::StrCat("unsupported safetensors dtype '", s, "'"));
}

absl::StatusOr<int64_t> JsonInt(const Json& v, const std::string& what) {
  int64_t out = 0;
  if (v.kind != Json::Kind::kNumber || !absl::SimpleAtoi(v.text, &out)) {
    return absl::DataLossError(absl::StrCat(what, " is not an integer"));
  }
  return out;
}

absl::Status ErrnoError(const std::string& what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(what, " '", path, "': ", std::strerror(errno)));
}

absl::Status ReadAt(int fd, void* data, int64_t size, int64_t offset, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::pread(fd, p, std::min<int64_t>(size, 1 << 30), offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("cannot read", path);
    }
    if (n == 0) return absl::DataLossError(absl::StrCat("'", path, "' is truncated"));
    p += n;
    size -= n;
    offset += n;
  }
  return absl::OkStatus();
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// DataLoss naming `path` when `crc` is not the checksum its metadata records
// (OK when it records none).
absl::Status CheckChecksum(const std::string& path, const SafetensorsHeader& header, uint32_t crc) {
  auto it = header.metadata.find(kChecksumKey);
  if (it == header.metadata.end() || it->second == absl::StrFormat("%08x", crc)) {
    return absl::OkStatus();
  }
  return absl::DataLossError(absl::StrCat("'", path, "' is corrupted: checksum ",
                                          absl::StrFormat("%08x", crc), " does not match ",
                                          it->second, " recorded at write time"));
}

// The CRC-32C of what a header says, its two checksums aside: each entry's
// name, dtype, shape and byte range (by name), then each metadata pair, in a
// fixed form, so that the JSON's spacing and order do not count.
uint32_t HeaderCrc(const std::vector<SafetensorsEntry>& entries,
                   const std::map<std::string, std::string>& metadata) {
  std::vector<const SafetensorsEntry*> by_name;
  for (const auto& e : entries) by_name.push_back(&e);
  std::sort(by_name.begin(), by_name.end(), [](auto* a, auto* b) { return a->name < b->name; });
  std::string said;
  for (const SafetensorsEntry* e : by_name) {
    absl::StrAppend(&said, e->name, std::string(1, '\0'), SafetensorsDtypeName(e->dtype), "|",
                    absl::StrJoin(e->shape.dims(), ","), "|", e->begin, "|", e->end, "\n");
  }
  for (const auto& [k, v] : metadata) {
    if (k == kChecksumKey || k == kHeaderChecksumKey) continue;
    absl::StrAppend(&said, k, std::string(1, '\0'), v, "\n");
  }
  return Crc32c(said.data(), static_cast<int64_t>(said.size()));
}

// The entries in offset order: the writer's order, which the checksum runs over.
std::vector<const SafetensorsEntry*> EntriesByOffset(const SafetensorsHeader& header) {
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : header.entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](auto* a, auto* b) { return a->begin < b->begin; });
  return by_offset;
}

}  // namespace

uint32_t Crc32c(const void* data, int64_t size, uint32_t crc) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t c = ~crc;
  while (size >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
    p += 8;
    size -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (size-- > 0) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}

const SafetensorsEntry* SafetensorsHeader::Find(const std::string& name) const {
  for (const SafetensorsEntry& e : entries) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

absl::Status WriteSafetensors(const std::string& path, const NamedTensors& tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsWriter::Decl> entries;
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' is undefined"));
    }
    entries.push_back({name, t.dtype(), t.shape()});
  }
  absl::StatusOr<std::unique_ptr<SafetensorsWriter>> w =
      SafetensorsWriter::Create(path, std::move(entries), metadata);
  if (!w.ok()) return w.status();
  for (const auto& [name, t] : tensors) {
    absl::Status s = (*w)->Append(t);
    if (!s.ok()) return s;
  }
  return (*w)->Finish();
}

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const std::string& path, std::vector<Decl> entries,
    const std::map<std::string, std::string>& metadata) {
  std::string header = "{";
  int64_t offset = 0;
  std::set<std::string> names;
  std::vector<SafetensorsEntry> said;  // what the header says, for its checksum
  for (const Decl& e : entries) {
    if (e.name == "__metadata__") {
      return absl::InvalidArgumentError("'__metadata__' is reserved in safetensors");
    }
    if (!names.insert(e.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", e.name, "' is declared twice"));
    }
    const int64_t bytes = e.shape.numel() * DtypeSize(e.dtype);
    absl::StrAppend(&header, header.size() > 1 ? "," : "", JsonQuote(e.name), ":{\"dtype\":\"",
                    SafetensorsDtypeName(e.dtype), "\",\"shape\":[",
                    absl::StrJoin(e.shape.dims(), ","), "],\"data_offsets\":[", offset, ",",
                    offset + bytes, "]}");
    said.push_back({e.name, e.dtype, e.shape, offset, offset + bytes});
    offset += bytes;
  }
  // The metadata, our checksums among it: the header's, and the data's (8
  // hex digits written by Finish).
  std::map<std::string, std::string> meta = metadata;
  meta[kChecksumKey] = "00000000";
  meta[kHeaderChecksumKey] = absl::StrFormat("%08x", HeaderCrc(said, meta));
  absl::StrAppend(&header, header.size() > 1 ? "," : "", "\"__metadata__\":{");
  int64_t checksum_at = -1;
  bool first = true;
  for (const auto& [k, v] : meta) {
    absl::StrAppend(&header, first ? "" : ",", JsonQuote(k), ":");
    if (k == kChecksumKey) checksum_at = 8 + static_cast<int64_t>(header.size()) + 1;  // past '"'
    absl::StrAppend(&header, JsonQuote(v));
    first = false;
  }
  header += "}}";
  while ((8 + header.size()) % 8 != 0) header += ' ';  // align the data section

  unsigned char len[8];
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  absl::StatusOr<std::unique_ptr<DurableFileWriter>> file = DurableFileWriter::Create(path);
  if (!file.ok()) return file.status();
  absl::Status s = (*file)->Append(absl::string_view(reinterpret_cast<const char*>(len), 8));
  if (s.ok()) s = (*file)->Append(header);
  if (!s.ok()) return s;
  return std::unique_ptr<SafetensorsWriter>(
      new SafetensorsWriter(std::move(entries), std::move(*file), checksum_at));
}

std::string SafetensorsWriter::next_name() const {
  return next_ < entries_.size() ? entries_[next_].name : std::string();
}

absl::Status SafetensorsWriter::Append(const Tensor& t) {
  if (next_ == entries_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("all ", entries_.size(), " declared tensors were already written"));
  }
  const Decl& e = entries_[next_];
  if (!t.defined()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", e.name, "' is undefined"));
  }
  if (t.dtype() != e.dtype || t.shape() != e.shape) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", e.name, "' is ", DtypeName(t.dtype()), " ", t.shape().ToString(),
                     ", declared ", DtypeName(e.dtype), " ", e.shape.ToString()));
  }
  const Tensor host = t.To(Device::Cpu()).Contiguous();
  const absl::string_view bytes(static_cast<const char*>(host.raw_data()),
                                static_cast<size_t>(host.nbytes()));
  crc_ = Crc32c(bytes.data(), static_cast<int64_t>(bytes.size()), crc_);
  absl::Status s = file_->Append(bytes);
  if (s.ok()) ++next_;
  return s;
}

absl::Status SafetensorsWriter::Finish() {
  if (next_ != entries_.size()) {
    return absl::FailedPreconditionError(absl::StrCat("tensor '", entries_[next_].name, "' (",
                                                      next_ + 1, " of ", entries_.size(),
                                                      ") was declared and not written"));
  }
  absl::Status s = file_->WriteAt(checksum_offset_, absl::StrFormat("%08x", crc_));
  if (!s.ok()) return s;
  return file_->Commit();
}

absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError("cannot open", path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError("cannot stat", path);
  const int64_t file_size = st.st_size;
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("'", path, "' is not a valid safetensors file: ", what));
  };
  if (file_size < 8) return bad(absl::StrCat("only ", file_size, " bytes (truncated?)"));
  unsigned char len[8];
  absl::Status s = ReadAt(fd.get(), len, 8, 0, path);
  if (!s.ok()) return s;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  if (n > static_cast<uint64_t>(kMaxHeaderBytes)) {
    return bad(absl::StrCat("header length ", n, " is more than the ", kMaxHeaderBytes,
                            " bytes a header may have"));
  }
  if (8 + static_cast<int64_t>(n) > file_size) {
    return bad(absl::StrCat("header length ", n, " exceeds the file size ", file_size,
                            " (truncated?)"));
  }
  std::string text(n, '\0');
  s = ReadAt(fd.get(), text.data(), n, 8, path);
  if (!s.ok()) return s;
  absl::StatusOr<Json> doc = ParseJson(text, 16, kMaxHeaderValues);
  if (!doc.ok()) return bad(std::string(doc.status().message()));
  if (doc->kind != Json::Kind::kObject) return bad("header is not a JSON object");

  SafetensorsHeader header;
  header.data_start = 8 + n;
  const int64_t data_size = file_size - header.data_start;
  std::set<std::string> names;
  for (const auto& [name, v] : doc->fields) {
    if (!names.insert(name).second) return bad(absl::StrCat("entry '", name, "' appears twice"));
    if (name == "__metadata__") {
      if (v.kind != Json::Kind::kObject && v.kind != Json::Kind::kNull) {
        return bad("__metadata__ must be an object of strings");
      }
      for (const auto& [k, mv] : v.fields) {
        if (mv.kind != Json::Kind::kString) return bad("metadata values must be strings");
        header.metadata[k] = mv.text;
      }
      continue;
    }
    SafetensorsEntry e;
    e.name = name;
    const Json* dtype = nullptr;
    const Json* shape = nullptr;
    const Json* offsets = nullptr;
    for (const auto& [k, fv] : v.fields) {
      if (k == "dtype") dtype = &fv;
      if (k == "shape") shape = &fv;
      if (k == "data_offsets") offsets = &fv;
    }
    if (!dtype || !shape || !offsets || offsets->items.size() != 2) {
      return bad(absl::StrCat("entry '", name, "' lacks dtype, shape or data_offsets"));
    }
    // (A string or null shape has no items: it would read as a scalar.)
    if (v.kind != Json::Kind::kObject || dtype->kind != Json::Kind::kString ||
        shape->kind != Json::Kind::kArray || offsets->kind != Json::Kind::kArray) {
      return bad(absl::StrCat("entry '", name, "' needs a dtype string, a shape array and a "
                              "data_offsets array"));
    }
    absl::StatusOr<Dtype> d = DtypeFromSafetensorsName(dtype->text);
    if (!d.ok()) return bad(absl::StrCat("entry '", name, "': ", d.status().message()));
    e.dtype = *d;
    if (shape->items.size() > static_cast<size_t>(kMaxRank)) {
      return bad(absl::StrCat("rank ", shape->items.size(), " of entry '", name,
                              "' is more than ", kMaxRank));
    }
    for (const Json& dim : shape->items) {
      absl::StatusOr<int64_t> x = JsonInt(dim, "shape");
      if (!x.ok() || *x < 0) return bad(absl::StrCat("entry '", name, "' has a bad shape"));
      e.shape.push_back(*x);
    }
    absl::StatusOr<int64_t> b = JsonInt(offsets->items[0], "data_offsets");
    absl::StatusOr<int64_t> en = JsonInt(offsets->items[1], "data_offsets");
    if (!b.ok() || !en.ok()) return bad(absl::StrCat("entry '", name, "' has bad offsets"));
    e.begin = *b;
    e.end = *en;
    if (e.begin < 0 || e.end < e.begin || e.end > data_size) {
      return bad(absl::StrCat("entry '", name, "' spans bytes [", e.begin, ", ", e.end,
                              ") but the data section has ", data_size, " (truncated?)"));
    }
    const std::optional<int64_t> numel = CheckedNumel(e.shape.span());
    int64_t bytes = 0;
    if (!numel || __builtin_mul_overflow(*numel, DtypeSize(e.dtype), &bytes)) {
      return bad(absl::StrCat("entry '", name, "' has shape ", e.shape.ToString(), " of ",
                              DtypeName(e.dtype), ": more than 2^63-1 bytes"));
    }
    if (e.end - e.begin != bytes) {
      return bad(absl::StrCat("entry '", name, "' has ", e.end - e.begin, " bytes for shape ",
                              e.shape.ToString(), " ", DtypeName(e.dtype)));
    }
    header.entries.push_back(std::move(e));
  }
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const auto& e : header.entries) spans.emplace_back(e.begin, e.end);
  std::sort(spans.begin(), spans.end());
  // The format indexes the whole data section, without holes (as Hugging
  // Face's reader requires): bytes after the last tensor were appended.
  int64_t covered = 0;
  for (const auto& [begin, end] : spans) {
    if (begin < covered) return bad("tensor data overlaps");
    if (begin > covered) {
      return bad(absl::StrCat("bytes [", covered, ", ", begin,
                              ") of the data section belong to no tensor"));
    }
    covered = end;
  }
  if (covered != data_size) {
    return bad(absl::StrCat(data_size - covered, " bytes follow the last tensor's data (the data "
                            "section has ", data_size, ", the tensors ", covered,
                            "): appended to, or another file written over it"));
  }
  auto recorded = header.metadata.find(kHeaderChecksumKey);
  if (recorded != header.metadata.end()) {  // files of other writers have none
    const std::string actual =
        absl::StrFormat("%08x", HeaderCrc(header.entries, header.metadata));
    if (recorded->second != actual) {
      return absl::DataLossError(absl::StrCat(
          "'", path, "' is corrupted: its header's checksum ", actual, " does not match ",
          recorded->second, " recorded at write time (a tensor's name, dtype, shape or place, or "
          "a metadata value, changed)"));
    }
  }
  return header;
}

absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path) {
  absl::StatusOr<SafetensorsHeader> header = ReadSafetensorsHeader(path);
  if (!header.ok()) return header.status();
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError("cannot open", path);
  SafetensorsFile file;
  std::map<std::string, Tensor> loaded;
  uint32_t crc = 0;
  for (const SafetensorsEntry* e : EntriesByOffset(*header)) {
    Tensor t = Tensor::Empty(e->shape, e->dtype);
    absl::Status s = ReadAt(fd.get(), t.raw_data(), e->end - e->begin, header->data_start + e->begin,
                            path);
    if (!s.ok()) return s;
    crc = Crc32c(t.raw_data(), e->end - e->begin, crc);
    loaded[e->name] = std::move(t);
  }
  absl::Status checked = CheckChecksum(path, *header, crc);
  if (!checked.ok()) return checked;
  for (const auto& e : header->entries) file.tensors.emplace_back(e.name, loaded[e.name]);
  file.header = std::move(*header);
  return file;
}

absl::Status VerifySafetensors(const std::string& path, const SafetensorsHeader& header) {
  if (header.metadata.count(kChecksumKey) == 0) return absl::OkStatus();
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError("cannot open", path);
  constexpr int64_t kPiece = int64_t{16} << 20;
  std::vector<char> buffer;
  uint32_t crc = 0;
  for (const SafetensorsEntry* e : EntriesByOffset(header)) {
    for (int64_t at = e->begin; at < e->end; at += kPiece) {
      const int64_t n = std::min(kPiece, e->end - at);
      buffer.resize(static_cast<size_t>(n));
      absl::Status s = ReadAt(fd.get(), buffer.data(), n, header.data_start + at, path);
      if (!s.ok()) return s;
      crc = Crc32c(buffer.data(), n, crc);
    }
  }
  return CheckChecksum(path, header, crc);
}

absl::StatusOr<SafetensorsHeader> ReadVerifiedSafetensorsHeader(const std::string& path) {
  absl::StatusOr<SafetensorsHeader> header = ReadSafetensorsHeader(path);
  if (!header.ok()) return header.status();
  absl::Status verified = VerifySafetensors(path, *header);
  if (!verified.ok()) return verified;
  return header;
}

absl::StatusOr<Tensor> ReadSafetensorsEntry(const std::string& path,
                                            const SafetensorsHeader& header,
                                            const SafetensorsEntry& entry) {
  Tensor t = Tensor::Empty(entry.shape, entry.dtype);
  absl::Status s = ReadSafetensorsSlice(path, header, entry.name, 0, t);
  if (!s.ok()) return s;
  return t;
}

absl::Status ReadSafetensorsSlice(const std::string& path, const SafetensorsHeader& header,
                                  const std::string& name, int64_t begin, Tensor& out) {
  const SafetensorsEntry* e = header.Find(name);
  if (e == nullptr) {
    return absl::NotFoundError(absl::StrCat("'", path, "' has no tensor named '", name, "'"));
  }
  const int64_t numel = e->shape.numel();
  if (begin < 0 || out.numel() > numel - begin) {
    return absl::OutOfRangeError(absl::StrCat("slice [", begin, ", ", begin + out.numel(),
                                              ") of '", name, "' exceeds its ", numel,
                                              " elements in '", path, "'"));
  }
  if (!out.device().is_cpu() || !out.is_contiguous()) {
    return absl::InvalidArgumentError("slice output must be a contiguous CPU tensor");
  }
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError("cannot open", path);
  const int64_t elem = DtypeSize(e->dtype);
  Tensor raw = e->dtype == out.dtype() ? out : Tensor::Empty(out.shape(), e->dtype);
  absl::Status s = ReadAt(fd.get(), raw.raw_data(), out.numel() * elem,
                          header.data_start + e->begin + begin * elem, path);
  if (!s.ok()) return s;
  if (!raw.SharesStorageWith(out)) out.CopyFrom(raw);
  return absl::OkStatus();
}

}  // namespace tensor
