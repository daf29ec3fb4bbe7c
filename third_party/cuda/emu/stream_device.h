// Which device a stream belongs to, for the emulated libraries (cuBLASLt,
// CUB, NCCL), whose work on a stream of another device fails as a kernel
// launched there does (the CUDA programming guide's "Stream and Event
// Behavior"). Defined in runtime.cc.
#ifndef THIRD_PARTY_CUDA_EMU_STREAM_DEVICE_H_
#define THIRD_PARTY_CUDA_EMU_STREAM_DEVICE_H_

#include <cuda_runtime.h>

namespace cuda_emu {

// True when `stream` is the current device's (the default streams always
// are). Otherwise says so on stderr ("cuda_emu: <what> on a stream of cuda:1
// with cuda:0 current"), sets the thread's last error to
// cudaErrorInvalidResourceHandle as the failed launch would (unless
// `sets_last_error` is false: a library that launches through its own
// runtime), and is false.
bool StreamOnCurrentDevice(cudaStream_t stream, const char* what, bool sets_last_error = true);

// The device of a created stream; -1 for the default streams (nullptr,
// cudaStreamLegacy, cudaStreamPerThread), which are whichever device is
// current where they are used.
int CreatedStreamDevice(cudaStream_t stream);

}  // namespace cuda_emu

#endif  // THIRD_PARTY_CUDA_EMU_STREAM_DEVICE_H_
