// State dicts of modules: every parameter (as fp32, whatever dtype the layers
// compute in) and buffer under its dotted name, and loading them back with
// checks that name what does not fit. Written to disk with tensor/safetensors.h.
#ifndef NN_STATE_DICT_H_
#define NN_STATE_DICT_H_

#include <string>

#include "absl/status/status.h"
#include "nn/module.h"
#include "tensor/safetensors.h"

namespace nn {

// Parameters (fp32 CPU copies... or the values themselves when already fp32 on
// the CPU) then buffers, in registration order, named with `prefix` + dotted name.
tensor::NamedTensors StateDict(Module& module, const std::string& prefix = "");

// Copies every entry into the module's parameters and buffers (converting
// dtype). Every parameter and buffer must be present with its shape; unknown
// names are errors too. Nothing is changed when an error is returned.
absl::Status LoadStateDict(Module& module, const tensor::NamedTensors& state,
                           const std::string& prefix = "");

// Makes the entries the parameters' initial values without copying them: each
// parameter's init becomes InitSpec::From(its entry), as fp32 on the CPU
// (shared when it already is), for Materialize or FSDP's sharded
// initialization to copy from, so that a rank shards pretrained weights
// without holding a whole copy of its own. Buffers are copied. The same checks
// as LoadStateDict; FailedPrecondition when a parameter already has values.
absl::Status InitFromStateDict(Module& module, const tensor::NamedTensors& state,
                               const std::string& prefix = "");

// Drops the references InitFromStateDict gave the parameters (once they are
// materialized or sharded), so that the loaded weights can be freed.
void ReleaseInitValues(Module& module);

}  // namespace nn

#endif  // NN_STATE_DICT_H_
