// The fused cross-entropy (tensor/cuda/loss.h: forward and backward in place,
// as minGPT's LM head runs it) at gpt2's shape: 16384 rows of 50257 bf16
// logits, 50304 apart (the padded head's rows), each block size a row may be
// given (cuda::SetCrossEntropyRowThreads: the default's choice, 1024 here, and
// 128 .. 1024) timed in alternating rounds on the compute stream (CUDA
// events), the logits restored before each round. Prints a line per size: ms
// a call (the median of the rounds), the GB/s of the bytes a call must move
// (each logit read once and its gradient written once) and the time over the
// default's; then one JSON line with the same figures.
//
//   ./bazelw run --config=cuda //tensor/cuda:loss_benchmark -- [rounds] [calls]
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tensor/cuda/bench_timing.h"
#include "tensor/cuda/loss.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tensor {
namespace {

using bench::CheckCuda;
using bench::EventMs;
using bench::Median;

constexpr int64_t kRows = 16384, kVocab = 50257, kStride = 50304;
constexpr int64_t kTile = 64;  // rows made on the host, copied over the rest

// Sizes timed: 0 (the default's choice) first, the ratios' base.
const std::vector<int> kSizes = {0, 128, 256, 512, 768, 1024};

int Run(int rounds, int calls) {
  const Device dev = Device::Cuda(0);
  const Dtype dt = Dtype::kBF16;
  // Random logits in [-5, 5), a tile of rows repeated (the host makes 64 rows,
  // not 16384), and the targets.
  const Tensor tile = testing::RandomTensor({kTile, kVocab}, 1, -5, 5, dt).To(dev);
  const Tensor pristine = Tensor::Empty({kRows, kStride}, dt, dev).Narrow(1, 0, kVocab);
  for (int64_t r = 0; r < kRows; r += kTile) pristine.Narrow(0, r, kTile).CopyFrom(tile);
  std::vector<int64_t> ids(kRows);
  for (int64_t r = 0; r < kRows; ++r) ids[r] = (r * 7919) % kVocab;
  const Tensor targets = Tensor::FromData<int64_t>(ids, {kRows}).To(dev);
  Tensor logits = Tensor::Empty({kRows, kStride}, dt, dev).Narrow(1, 0, kVocab);
  const Tensor lse = Tensor::Empty({kRows}, Dtype::kF32, dev);
  const Tensor loss = Tensor::Empty({}, Dtype::kF32, dev);
  auto call = [&] {
    cuda::CrossEntropyForwardBackwardInPlace(logits, targets, -100, 1.0f, lse, loss);
  };
  std::vector<std::vector<double>> ms(kSizes.size());
  for (size_t s = 0; s < kSizes.size(); ++s) {  // warm-up: each size once
    cuda::SetCrossEntropyRowThreads(kSizes[s]);
    logits.CopyFrom(pristine);
    call();
  }
  for (int r = 0; r < rounds; ++r) {
    for (size_t k = 0; k < kSizes.size(); ++k) {
      // Each round another size goes first.
      const size_t s = (k + static_cast<size_t>(r)) % kSizes.size();
      cuda::SetCrossEntropyRowThreads(kSizes[s]);
      logits.CopyFrom(pristine);
      CheckCuda(cudaStreamSynchronize(cudaStreamPerThread), "restoring the logits");
      ms[s].push_back(EventMs(call, calls));
    }
  }
  cuda::SetCrossEntropyRowThreads(0);
  const double bytes = 2.0 * kRows * kVocab * 2;  // read, written
  const double base = Median(ms[0]);
  std::string json = "{\"loss_benchmark\":[";
  for (size_t s = 0; s < kSizes.size(); ++s) {
    const double m = Median(ms[s]);
    const std::string name =
        kSizes[s] == 0 ? std::string("default") : std::to_string(kSizes[s]) + " threads";
    std::printf("cross_entropy fused %lldx%lld bf16, %-12s %.4f ms (%6.0f GB/s)  / default %.3f\n",
                static_cast<long long>(kRows), static_cast<long long>(kVocab), name.c_str(), m,
                bytes / m / 1e6, m / base);
    char buf[160];
    std::snprintf(buf, sizeof(buf), "%s{\"row_threads\":%d,\"ms\":%.5f,\"bytes\":%.0f}",
                  s == 0 ? "" : ",", kSizes[s], m, bytes);
    json += buf;
  }
  json += "]}";
  std::printf("%s\n", json.c_str());
  return 0;
}

}  // namespace
}  // namespace tensor

int main(int argc, char** argv) {
  return tensor::bench::RoundsAndCallsMain(argc, argv, "loss_benchmark", 7, 5, tensor::Run);
}
