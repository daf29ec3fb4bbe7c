// The norm kernels (tensor/cuda/norm.h) at the shapes a training step gives
// them, each timed with its rows held in registers (cuda::NormHoldRows, the
// default) and loaded by each pass, in alternating rounds on the compute
// stream (CUDA events): gpt2's LayerNorm (16384 x 768 bf16, f32 weight and
// bias; the backward with the residual's gradient added and the parameter
// gradients written, as a block's norms run) and T5's RMSNorm (d_model 512
// and 768). Prints a line per case: ms a call (the median of the rounds), the
// GB/s of the bytes each call must move (forward: x read, y written;
// backward: grad_y, x and the residual's gradient read, grad_x written), and
// held / loaded. Then one JSON line with the same figures.
//
//   ./bazelw run --config=cuda //tensor/cuda:norm_benchmark -- [rounds] [calls]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "tensor/cuda/bench_timing.h"
#include "tensor/cuda/norm.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tensor {
namespace {

using bench::EventMs;
using bench::Median;

struct Case {
  std::string name;
  double bytes;  // each call must move at least these
  std::function<void()> fn;
};

struct Result {
  std::string name;
  double held_ms, loaded_ms, bytes;
};

// The forward and backward cases of one norm over (rows, c) bf16.
std::vector<Case> Cases(bool layer_norm, int64_t rows, int64_t c) {
  const Device dev = Device::Cuda(0);
  const Dtype dt = Dtype::kBF16;
  const Tensor x = testing::RandomTensor({rows, c}, 1, -2, 3, dt).To(dev);
  const Tensor gy = testing::RandomTensor({rows, c}, 2, -1, 1, dt).To(dev);
  const Tensor add = testing::RandomTensor({rows, c}, 3, -1, 1, dt).To(dev);
  const Tensor w = testing::RandomTensor({c}, 4, 0.5, 1.5).To(dev);
  const Tensor b = testing::RandomTensor({c}, 5, -0.5, 0.5).To(dev);
  const Tensor y = Tensor::Empty({rows, c}, dt, dev), gx = Tensor::Empty({rows, c}, dt, dev);
  const Tensor mean = Tensor::Empty({rows}, Dtype::kF32, dev);
  const Tensor rstd = Tensor::Empty({rows}, Dtype::kF32, dev);
  const Tensor gw = Tensor::Empty({c}, Dtype::kF32, dev), gb = Tensor::Empty({c}, Dtype::kF32, dev);
  const double row_bytes = static_cast<double>(rows) * c * 2;
  const std::string shape = std::to_string(rows) + "x" + std::to_string(c);
  if (layer_norm) {
    return {
        {"layer_norm forward " + shape, 2 * row_bytes,
         [=] { cuda::LayerNormForward(x, w, b, 1e-5f, y, mean, rstd); }},
        {"layer_norm backward " + shape, 4 * row_bytes,
         [=] { cuda::LayerNormBackward(gy, x, w, mean, rstd, add, gx, gw, gb); }},
    };
  }
  return {
      {"rms_norm forward " + shape, 2 * row_bytes,
       [=] { cuda::RmsNormForward(x, w, 1e-6f, y, rstd); }},
      {"rms_norm backward " + shape, 4 * row_bytes,
       [=] { cuda::RmsNormBackward(gy, x, w, rstd, add, gx, gw); }},
  };
}

int Run(int rounds, int calls) {
  std::vector<Case> cases = Cases(true, 16384, 768);
  for (int64_t c : {512, 768}) {
    for (Case& k : Cases(false, 16384, c)) cases.push_back(std::move(k));
  }
  std::vector<Result> results;
  for (const Case& k : cases) {
    // Warm-up both ways. (Each norm's forward case comes before its backward
    // and shares its tensors: the backward reads the forward's mean / rstd.)
    for (bool hold : {false, true}) {
      cuda::SetNormHoldRows(hold);
      k.fn();
    }
    std::vector<double> held, loaded;
    for (int r = 0; r < rounds; ++r) {
      for (bool hold : {r % 2 == 0, r % 2 != 0}) {
        cuda::SetNormHoldRows(hold);
        (hold ? held : loaded).push_back(EventMs(k.fn, calls));
      }
    }
    cuda::SetNormHoldRows(true);
    const Result res{k.name, Median(held), Median(loaded), k.bytes};
    std::printf("%-32s held %.4f ms (%6.0f GB/s)  loaded %.4f ms (%6.0f GB/s)  held/loaded %.3f\n",
                res.name.c_str(), res.held_ms, res.bytes / res.held_ms / 1e6, res.loaded_ms,
                res.bytes / res.loaded_ms / 1e6, res.held_ms / res.loaded_ms);
    results.push_back(res);
  }
  std::string json = "{\"norm_benchmark\":[";
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "%s{\"case\":\"%s\",\"held_ms\":%.5f,\"loaded_ms\":%.5f,\"bytes\":%.0f}",
                  i == 0 ? "" : ",", r.name.c_str(), r.held_ms, r.loaded_ms, r.bytes);
    json += buf;
  }
  json += "]}";
  std::printf("%s\n", json.c_str());
  return 0;
}

}  // namespace
}  // namespace tensor

int main(int argc, char** argv) {
  return tensor::bench::RoundsAndCallsMain(argc, argv, "norm_benchmark", 11, 20, tensor::Run);
}
