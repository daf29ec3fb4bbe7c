// Reading a sharded checkpoint's stored slices: element ranges of a parameter
// (or optimizer buffer) from the shard files that index.json lists, checking
// each file once (size, checkpoint id, tensor entry) and every checksum block
// it reads. Private to the sharded_checkpoint library.
#ifndef DIST_SHARDED_CHECKPOINT_READER_H_
#define DIST_SHARDED_CHECKPOINT_READER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dist/sharded_checkpoint_index.h"
#include "tensor/safetensors.h"
#include "tensor/tensor.h"

namespace dist::sharded {

class SliceReader {
 public:
  // `index` (validated, as ReadIndex returns it) must outlive the reader.
  SliceReader(const std::string& dir, const Index& index) : dir_(dir), index_(index) {}

  // Elements [lo, hi) of the parameter (or buffer) that `s` belongs to (lo, hi
  // within [s.begin, s.end)) into `out` (hi - lo elements, f32, contiguous, on the CPU;
  // InvalidArgument otherwise): whole checksum blocks are read into it directly, with no copy of
  // the range.
  absl::Status Read(const SliceRec& s, int64_t lo, int64_t hi, tensor::Tensor out);

  // Checks every file index.json lists (there, of its recorded size, of this
  // checkpoint), reading their headers only: what Read would find wrong with
  // a file, before any data is read.
  absl::Status CheckFiles();

  // Fills out (hi - lo elements) with elements [lo, hi) of the tensor stored
  // as `slices` (which tile it).
  absl::Status ReadRange(const std::vector<SliceRec>& slices, int64_t lo, int64_t hi,
                         tensor::Tensor out);

 private:
  std::string Path(int file) const;
  absl::StatusOr<const tensor::SafetensorsHeader*> Header(int file);

  std::string dir_;
  const Index& index_;
  std::map<int, tensor::SafetensorsHeader> headers_;
};

}  // namespace dist::sharded

#endif  // DIST_SHARDED_CHECKPOINT_READER_H_
