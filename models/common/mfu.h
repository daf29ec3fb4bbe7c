// Model FLOPs utilization (MFU), as nanoGPT's estimate_mfu and llm.c report
// it: the model's FLOPs per token (a model's own count, e.g.
// mingpt::FlopsPerToken) times the tokens trained per second, over the dense
// peak of the devices computing. The train binaries add it to their step lines
// when a peak is known (a GPU from the table below, or --peak_tflops).
#ifndef MODELS_COMMON_MFU_H_
#define MODELS_COMMON_MFU_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tensor/device.h"
#include "tensor/dtype.h"

namespace train {

// Dense (no sparsity) tensor-core peak in TFLOP/s of a GPU named
// `device_name` (cudaGetDeviceProperties' name) for bf16 / f16 inputs, by
// NVIDIA's data sheets, the most specific name first: H100 PCIe 756, H100
// NVL 835, GH200 / H200 / H100 (SXM) 989.5, A100 312. 0 when the name is not
// in the table or for other dtypes (f32 runs have no tensor-core peak here).
// tools/bench_vs_pytorch.py keeps the same table.
double GpuPeakTflops(absl::string_view device_name, tensor::Dtype compute_dtype);

// The peak FLOP/s the MFU of a run is measured against: `flag_tflops` (>= 0;
// --peak_tflops) per device when > 0, else the GPU's table peak
// (GpuPeakTflops of `device`'s name, 0 for the CPU or an unknown GPU), times
// `devices` (the GPUs the run's ranks compute on: 1 for ranks sharing one,
// the world size for one rank per GPU). 0: no MFU. A negative flag is
// InvalidArgument naming it.
absl::StatusOr<double> PeakFlops(double flag_tflops, tensor::Device device,
                                 tensor::Dtype compute_dtype, int devices);

}  // namespace train

#endif  // MODELS_COMMON_MFU_H_
