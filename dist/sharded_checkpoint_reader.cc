// Checked reads of a sharded checkpoint's slices (see
// sharded_checkpoint_reader.h).
#include "dist/sharded_checkpoint_reader.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "dist/sharded_checkpoint_folder.h"
#include "tensor/memory_ledger.h"

namespace dist::sharded {

using tensor::Tensor;

absl::Status SliceReader::Read(const SliceRec& s, int64_t lo, int64_t hi, Tensor out) {
  absl::StatusOr<const tensor::SafetensorsHeader*> header = Header(s.file);
  if (!header.ok()) return header.status();
  const std::string path = Path(s.file);
  const tensor::SafetensorsEntry* e = (*header)->Find(s.tensor);
  if (e == nullptr) {
    return absl::DataLossError(
        absl::StrCat("'", path, "' lacks tensor '", s.tensor, "' that index.json lists"));
  }
  if (e->dtype != tensor::Dtype::kF32 || e->shape.numel() != s.end - s.begin) {
    return absl::DataLossError(absl::StrCat(
        "'", path, "': tensor '", s.tensor, "' is ", tensor::DtypeName(e->dtype), " ",
        e->shape.ToString(), ", index.json records f32 of ", s.end - s.begin, " elements"));
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
  absl::Status read = tensor::ReadSafetensorsSlice(path, **header, s.tensor, rb, raw);
  if (!read.ok()) return read;
  const std::vector<uint32_t> crcs = BlockCrcs(raw.data<float>(), re - rb, block);
  for (int64_t b = first; b < last; ++b) {
    const uint32_t crc = crcs[b - first];
    if (crc != s.crcs[b]) {
      const int64_t be = std::min((b + 1) * block, s.end - s.begin);
      return absl::DataLossError(absl::StrCat(
          "'", path, "' is corrupted: tensor '", s.tensor, "' elements [", b * block, ", ", be,
          ") have checksum ", Hex32(crc), " but index.json records ", Hex32(s.crcs[b])));
    }
  }
  out.CopyFrom(raw.Narrow(0, lo - s.begin - rb, hi - lo));
  return absl::OkStatus();
}

absl::Status SliceReader::ReadRange(const std::vector<SliceRec>& slices, int64_t lo, int64_t hi,
                                    Tensor out) {
  for (const SliceRec& s : slices) {
    const int64_t a = std::max(lo, s.begin);
    const int64_t b = std::min(hi, s.end);
    if (a >= b) continue;
    absl::Status read = Read(s, a, b, out.Narrow(0, a - lo, b - a));
    if (!read.ok()) return read;
  }
  return absl::OkStatus();
}

absl::Status SliceReader::CheckFiles() {
  for (int file = 0; file < static_cast<int>(index_.files.size()); ++file) {
    absl::StatusOr<const tensor::SafetensorsHeader*> header = Header(file);
    if (!header.ok()) return header.status();
  }
  return absl::OkStatus();
}

std::string SliceReader::Path(int file) const {
  return absl::StrCat(dir_, "/", index_.files[file].name);
}

absl::StatusOr<const tensor::SafetensorsHeader*> SliceReader::Header(int file) {
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
    return absl::DataLossError(
        absl::StrCat("'", path, "' belongs to another checkpoint (id ",
                     id == h->metadata.end() ? std::string("none") : id->second,
                     ", index.json has ", index_.id, ")"));
  }
  return &headers_.emplace(file, std::move(*h)).first->second;
}

}  // namespace dist::sharded
