// The module buffers of a sharded checkpoint (BatchNorm's running_mean,
// running_var, num_batches_tracked): replicated on every rank, so saved once,
// whole, by rank 0, in their own dtypes, into kBuffersFile beside the shard
// files (as PyTorch's SHARDED_STATE_DICT keeps buffers unsharded); index.json
// lists each one's name, shape, dtype and CRC-32C, and the file's size.
// Loading reads them on every rank (they are small), checked against the
// model's buffers and the index. Private to the sharded_checkpoint libraries.
#ifndef DIST_SHARDED_CHECKPOINT_BUFFERS_H_
#define DIST_SHARDED_CHECKPOINT_BUFFERS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dist/sharded_checkpoint_index.h"
#include "tensor/safetensors.h"
#include "tensor/tensor.h"

namespace dist::sharded {

// A model's buffers as nn::Module::NamedBuffers() gives them.
using ModuleBuffers = std::vector<std::pair<std::string, tensor::Tensor*>>;

// Writes `buffers` (any device; host copies, each in its own dtype) into
// <dir>/kBuffersFile with checkpoint id `id` in its metadata, and returns
// the records index.json keeps. Writes nothing (and returns no records)
// when there are none. InvalidArgument naming an undefined buffer.
absl::StatusOr<BuffersFileRec> WriteBuffers(const std::string& dir, const std::string& id,
                                            const tensor::NamedTensors& buffers);

// Every buffer `x` lists, read whole from <dir>/kBuffersFile (CPU tensors, in
// x's order), checked: the file is there, of the size x records, of this
// checkpoint (id), and each tensor has the listed dtype, shape and CRC-32C.
// DataLoss (NotFound for a missing file) naming the file and the buffer.
absl::StatusOr<tensor::NamedTensors> ReadBuffers(const std::string& dir, const Index& x);

// The checkpoint's buffers for `model` (its buffers in its order): the names,
// shapes and dtypes must match both ways (InvalidArgument naming the buffers
// of the model missing from the checkpoint, for a checkpoint saved without
// buffers too; those the model lacks; another shape or dtype), then
// ReadBuffers. Changes nothing in the model.
absl::StatusOr<std::vector<tensor::Tensor>> StageBuffers(const std::string& dir, const Index& x,
                                                         const ModuleBuffers& model);

// Copies staged[i] (as StageBuffers returns) into model[i] on its device.
void CommitBuffers(const std::vector<tensor::Tensor>& staged, const ModuleBuffers& model);

}  // namespace dist::sharded

#endif  // DIST_SHARDED_CHECKPOINT_BUFFERS_H_
