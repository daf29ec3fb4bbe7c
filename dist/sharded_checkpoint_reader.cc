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
  if (out.dtype() != tensor::Dtype::kF32 || !out.device().is_cpu() || !out.is_contiguous() ||
      out.numel() != hi - lo) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reading '", s.tensor, "': needs ", hi - lo, " contiguous f32 host elements, got ",
        out.numel(), " ", DtypeName(out.dtype()), " on ", out.device().ToString()));
  }
  // Every checksum block that overlaps [lo, hi) is read whole and checked.
  // Runs of blocks inside the range are read straight into `out`; a block
  // the range cuts (at most one at each end) goes through a one-block buffer.
  const int64_t block = index_.crc_block;
  const int64_t n = s.end - s.begin;
  const int64_t rel_lo = lo - s.begin, rel_hi = hi - s.begin;  // within the slice
  auto check = [&](int64_t b, const float* data) -> absl::Status {
    const int64_t bb = b * block, be = std::min(bb + block, n);
    const uint32_t crc = BlockCrcs(data, be - bb, block).at(0);
    if (crc == s.crcs[b]) return absl::OkStatus();
    return absl::DataLossError(
        absl::StrCat("'", path, "' is corrupted: tensor '", s.tensor, "' elements [", bb, ", ", be,
                     ") have checksum ", Hex32(crc), " but index.json records ", Hex32(s.crcs[b])));
  };
  const int64_t last = (rel_hi + block - 1) / block;  // exclusive
  for (int64_t b = rel_lo / block; b < last;) {
    const int64_t bb = b * block, be = std::min(bb + block, n);
    if (bb >= rel_lo && be <= rel_hi) {
      int64_t e = b + 1;  // the run of whole blocks [b, e)
      while (e < last && std::min((e + 1) * block, n) <= rel_hi) ++e;
      const int64_t re = std::min(e * block, n);
      Tensor dst = out.Narrow(0, bb - rel_lo, re - bb);
      absl::Status read = tensor::ReadSafetensorsSlice(path, **header, s.tensor, bb, dst);
      if (!read.ok()) return read;
      for (int64_t k = b; k < e; ++k) {
        absl::Status c = check(k, dst.data<float>() + (k * block - bb));
        if (!c.ok()) return c;
      }
      b = e;
      continue;
    }
    Tensor raw;
    {
      tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kTemporaries);
      raw = Tensor::Empty({be - bb}, tensor::Dtype::kF32);
    }
    absl::Status read = tensor::ReadSafetensorsSlice(path, **header, s.tensor, bb, raw);
    if (!read.ok()) return read;
    absl::Status c = check(b, raw.data<float>());
    if (!c.ok()) return c;
    const int64_t a = std::max(bb, rel_lo), z = std::min(be, rel_hi);
    out.Narrow(0, a - rel_lo, z - a).CopyFrom(raw.Narrow(0, a - bb, z - a));
    ++b;
  }
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
  // Which shard of the checkpoint the file says it is ("i/n"; none before
  // fsdp.shard was checked): another one's means files renamed or swapped.
  const std::string want_shard = absl::StrCat(file, "/", index_.files.size());
  auto misplaced = [&](const tensor::SafetensorsHeader& h) -> absl::Status {
    auto shard = h.metadata.find(kShardKey);
    auto id = h.metadata.find(kIdKey);
    if (shard == h.metadata.end() || shard->second == want_shard) return absl::OkStatus();
    const bool same_id = id != h.metadata.end() && id->second == index_.id;
    return absl::DataLossError(absl::StrCat(
        "'", path, "' holds shard ", shard->second, same_id ? " of this checkpoint" : "",
        " (its ", kShardKey, ") where index.json lists shard ", want_shard,
        ": shard files renamed, swapped or copied from another checkpoint"));
  };
  if (st.st_size != rec.bytes) {
    // A whole shard file in the wrong place says so rather than its size.
    absl::StatusOr<tensor::SafetensorsHeader> h = tensor::ReadSafetensorsHeader(path);
    if (h.ok()) {
      absl::Status s = misplaced(*h);
      if (!s.ok()) return s;
    }
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
  absl::Status s = misplaced(*h);
  if (!s.ok()) return s;
  return &headers_.emplace(file, std::move(*h)).first->second;
}

}  // namespace dist::sharded
