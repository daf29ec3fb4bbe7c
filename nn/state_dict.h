// State dicts of modules: every parameter (as fp32, whatever dtype the layers
// compute in) and buffer under its dotted name, and loading them back with
// checks that name what does not fit. Written to disk with tensor/safetensors.h.
#ifndef NN_STATE_DICT_H_
#define NN_STATE_DICT_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "nn/module.h"
#include "nn/parameter.h"
#include "tensor/safetensors.h"

namespace nn {

// Parameters (fp32 CPU copies... or the values themselves when already fp32 on
// the CPU) then buffers, in registration order, named with `prefix` + dotted name.
// Throws (OP_CHECK) for a parameter a wrapper holds (Parameter::held_by: an
// FSDP unit, ZeRO-1), whose value is not the model's: ask the wrapper.
tensor::NamedTensors StateDict(Module& module, const std::string& prefix = "");

// The checks of LoadStateDict on `state`, for loaders of their own (FSDP's
// LoadFullStateDict): every parameter and defined buffer of `module` named
// once, with its shape, in a floating dtype for a parameter or a floating
// buffer, and no name the module lacks. InvalidArgument naming what does
// not fit ("state dict lacks 2 entries: a, b", "state dict entry 'w' has
// shape (3), the model expects (4)", ...).
absl::Status CheckStateDict(Module& module, const tensor::NamedTensors& state);

// Copies every entry into the module's parameters and buffers (converting
// dtype), after CheckStateDict's checks; FailedPrecondition for a parameter
// a wrapper holds, which would replace the value. Nothing is changed when an
// error is returned.
absl::Status LoadStateDict(Module& module, const tensor::NamedTensors& state,
                           const std::string& prefix = "");

// The same from a safetensors file whose header ReadSafetensorsHeader read
// (verify its checksum first, VerifySafetensors, to have it checked): each
// entry is read straight into its parameter or buffer (through one host
// tensor when that lives on a GPU), so the file is never held whole. The
// checks run before anything is read; a read error after them (the file
// changed on disk) can leave the module partly loaded.
absl::Status LoadStateDictFromSafetensors(Module& module, const std::string& path,
                                          const tensor::SafetensorsHeader& header,
                                          const std::string& prefix = "");

// Named sources of initial values (a tensor in memory, a file read slice by
// slice, ...).
using NamedInitSources = std::vector<std::pair<std::string, std::shared_ptr<const InitSource>>>;

// Makes the sources the parameters' initial values without reading them: each
// parameter's init becomes InitSpec::From(its source), which Materialize or
// FSDP's sharded initialization reads, so that a rank shards pretrained
// weights reading and holding only its shard. Buffers are read now. The same
// name and shape checks as LoadStateDict; FailedPrecondition when a parameter
// already has values. Nothing is changed when an error is returned.
absl::Status InitFromSources(Module& module, const NamedInitSources& sources,
                             const std::string& prefix = "");

// The entries of a safetensors file as sources read slice by slice
// (tensor::ReadSafetensorsSlice), so that a rank reads only its shard. The
// file's checksum is verified here, reading it in pieces. Errors name the file.
absl::StatusOr<NamedInitSources> SafetensorsInitSources(const std::string& path);

// One entry of a safetensors file whose header ReadSafetensorsHeader read (and
// whose checksum the caller verified, if it wants it checked) as a source read
// slice by slice. `entry` must be one of header's, of a floating dtype.
std::shared_ptr<const InitSource> SafetensorsEntrySource(
    std::string path, std::shared_ptr<const tensor::SafetensorsHeader> header,
    const tensor::SafetensorsEntry& entry);

// A 2-D `source` of shape (rows, cols) read as its transpose (cols, rows),
// without holding the whole: elements of the transpose's rows [a, b) are read
// as the segments [a, b) of each source row (rows reads), then transposed.
// For weights stored (in, out), as Hugging Face's Conv1D stores them, where a
// Linear is (out, in).
std::shared_ptr<const InitSource> TransposedInitSource(std::shared_ptr<const InitSource> source);

// Tensors in memory as sources, on the host (shared, not copied, when they are
// contiguous on the CPU), so that each read is a slice and not a device copy.
NamedInitSources TensorInitSources(tensor::NamedTensors tensors);

// InitFromSources(module, TensorInitSources(state), prefix).
absl::Status InitFromStateDict(Module& module, const tensor::NamedTensors& state,
                               const std::string& prefix = "");

// Drops the references InitFromSources gave the parameters (once they are
// materialized or sharded), so that the loaded weights can be freed.
void ReleaseInitValues(Module& module);

}  // namespace nn

#endif  // NN_STATE_DICT_H_
