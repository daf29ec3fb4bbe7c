// The on-disk format of a sharded checkpoint (see dist/sharded_checkpoint.h)
// without any process group: the records of index.json (files, parameters,
// slices), writing them as JSON, reading and validating them, and the
// format's names (files, tensors, metadata keys) and block checksums.
// Private to the sharded_checkpoint library.
#ifndef DIST_SHARDED_CHECKPOINT_INDEX_H_
#define DIST_SHARDED_CHECKPOINT_INDEX_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tensor/dtype.h"
#include "tensor/shape.h"

namespace dist::sharded {

inline constexpr char kIndexFile[] = "index.json";
inline constexpr char kFormat[] = "fsdp.sharded_checkpoint";
// Version 2: the checkpoint holds module buffers (kBuffersFile); version 1:
// it holds none (also every checkpoint of the builds before buffers were
// saved). A checkpoint without buffers is written as version 1, so builds
// before buffers still load it; one with buffers as version 2, which those
// builds refuse rather than load without its buffers.
inline constexpr int kVersion = 2;
inline constexpr int kVersionWithoutBuffers = 1;
// The file of the module buffers (written whole by rank 0).
inline constexpr char kBuffersFile[] = "buffers.safetensors";
// Shard file metadata: the checkpoint id, and "<file index>/<files>".
inline constexpr char kIdKey[] = "fsdp.checkpoint_id";
inline constexpr char kShardKey[] = "fsdp.shard";
// index.json's last field: the CRC-32C of its text before that field's line.
inline constexpr char kIndexCrcKey[] = "index_crc32c";
// The slice kind of parameter values (the others are optimizer buffer keys).
inline constexpr char kValueKind[] = "value";
// Slices are checksummed in blocks of this many elements (1 MiB of fp32), so
// a reader that needs part of a slice reads and checks at most one partial
// block at each end.
inline constexpr int64_t kDefaultCrcBlock = int64_t{1} << 18;

// Elements [begin, end) of one parameter (or optimizer buffer), stored as the
// 1-D f32 tensor `tensor` of file #`file`.
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

// A module buffer (BatchNorm's running statistics: buffers are replicated on
// every rank), stored whole in kBuffersFile in its own dtype under its name.
struct BufferRec {
  std::string name;
  tensor::Shape shape;
  tensor::Dtype dtype = tensor::Dtype::kF32;
  uint32_t crc = 0;  // CRC-32C of its bytes
};

// kBuffersFile: its size and what it holds (no buffers: no file).
struct BuffersFileRec {
  int64_t bytes = 0;
  std::vector<BufferRec> tensors;  // the model's NamedBuffers() order
};

struct Index {
  int version = kVersionWithoutBuffers;  // as read (IndexToJson writes it from model_buffers)
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
  BuffersFileRec model_buffers;
  std::map<std::string, std::string> extra;

  std::map<std::string, size_t> by_name;  // filled by ValidateIndex
};

// A fresh random checkpoint id (hex; random bits, the time and the pid).
std::string NewCheckpointId();

// A checksum as index.json writes it: 8 lowercase hex digits.
std::string Hex32(uint32_t x);

// "shard_<r>_of_<n>.safetensors".
std::string ShardFileName(int r, int n);

// Whether `name` is one of the files a sharded checkpoint folder holds
// (index.json, shard files, kBuffersFile, and their temporaries).
bool IsCheckpointFile(const std::string& name);

// The tensor name of a slice starting at element `begin` of `param`:
// "model/<param>@<begin>" (kind kValueKind) or "optim/<kind>/<param>@<begin>".
std::string SliceTensorName(const std::string& kind, const std::string& param, int64_t begin);

// CRC-32C of each `block` elements of data[0, n) (the last block may be
// shorter).
std::vector<uint32_t> BlockCrcs(const float* data, int64_t n, int64_t block);

// index.json's text, ending with its checksum (kIndexCrcKey). Its version is
// kVersion with buffers, kVersionWithoutBuffers without (x.version is not
// read).
std::string IndexToJson(const Index& x);

// Checks the index's consistency (file names, slices that tile every
// parameter with one checksum per block, optimizer buffers, module buffers
// named once each), sorts each
// parameter's slices by `begin` and fills by_name. DataLoss on error.
absl::Status ValidateIndex(Index& x);

// Parses and validates index.json's text, and checks it against its
// checksum (an index without one is taken as it is). Errors name the field
// ("params[3].shape is not a shape").
absl::StatusOr<Index> ParseIndex(const std::string& text);

// Reads and parses <dir>/index.json; errors name the folder or the file.
absl::StatusOr<Index> ReadIndex(const std::string& dir);

}  // namespace dist::sharded

#endif  // DIST_SHARDED_CHECKPOINT_INDEX_H_
