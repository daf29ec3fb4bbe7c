// The generic check of the CUDA backend against the CPU (testing.h).
#include "tensor/cuda/testing.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensor/cuda_backend.h"

namespace tensor {
namespace cuda {
namespace testing {

bool HasGpu() { return Built() && DeviceCount() > 0; }

Tensor ToGpu(const Tensor& t, int index) { return t.To(Device::Cuda(index)); }
Tensor ToCpu(const Tensor& t) { return t.To(Device::Cpu()); }

Tolerance DefaultTolerance(Dtype dtype, double factor) {
  switch (dtype) {
    case Dtype::kBF16:
      return {1.6e-2 * factor, 1.6e-2 * factor};
    case Dtype::kF16:
      return {2e-3 * factor, 2e-3 * factor};
    default:
      return {1e-5 * factor, 1e-5 * factor};
  }
}

::testing::AssertionResult MatchesCpu(const Tensor& gpu, const Tensor& cpu) {
  return MatchesCpu(gpu, cpu, DefaultTolerance(cpu.dtype()));
}

::testing::AssertionResult MatchesCpu(const Tensor& gpu, const Tensor& cpu, Tolerance tol) {
  if (!gpu.device().is_cuda()) {
    return ::testing::AssertionFailure() << "result is on " << gpu.device().ToString()
                                         << ", not a CUDA device";
  }
  if (gpu.shape() != cpu.shape() || gpu.dtype() != cpu.dtype()) {
    return ::testing::AssertionFailure()
           << "gpu " << gpu.shape().ToString() << " " << DtypeName(gpu.dtype()) << " vs cpu "
           << cpu.shape().ToString() << " " << DtypeName(cpu.dtype());
  }
  const std::vector<float> g = ToCpu(gpu).Contiguous().To(Dtype::kF32).ToVector<float>();
  const std::vector<float> c = cpu.Contiguous().To(Dtype::kF32).ToVector<float>();
  std::string bad;
  int64_t n_bad = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    const bool both_nan = std::isnan(g[i]) && std::isnan(c[i]);
    const bool ok = both_nan || g[i] == c[i] ||
                    std::abs(double(g[i]) - c[i]) <= tol.atol + tol.rtol * std::abs(double(c[i]));
    if (ok) continue;
    if (++n_bad <= 5) absl::StrAppend(&bad, " [", i, "] gpu ", g[i], " cpu ", c[i], ";");
  }
  if (n_bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << n_bad << " of " << c.size()
                                       << " elements differ beyond rtol " << tol.rtol << " atol "
                                       << tol.atol << ":" << bad;
}

::testing::AssertionResult NearScaled(const Tensor& gpu, const std::vector<double>& ref,
                                      double tol) {
  const std::vector<float> g = ToCpu(gpu).Contiguous().To(Dtype::kF32).ToVector<float>();
  if (g.size() != ref.size()) {
    return ::testing::AssertionFailure() << "size " << g.size() << " vs " << ref.size();
  }
  double max_ref = 0;
  for (double x : ref) {
    if (std::isfinite(x)) max_ref = std::max(max_ref, std::abs(x));
  }
  const double scale = std::max(max_ref, 1e-2);
  int64_t bad = 0, worst = -1;
  double worst_err = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isinf(ref[i]) && g[i] == ref[i]) continue;
    const double err = std::abs(double(g[i]) - ref[i]);
    if (!(err <= tol * (scale + std::abs(ref[i])))) {
      ++bad;
      if (worst < 0 || !(err <= worst_err)) {
        worst = static_cast<int64_t>(i);
        worst_err = err;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << g.size() << " elements off (tol " << tol << ", max|ref| " << max_ref
         << "); worst [" << worst << "] gpu " << g[worst] << " ref " << ref[worst];
}

::testing::AssertionResult NearScaled(const Tensor& gpu, const Tensor& cpu, double tol) {
  if (gpu.shape() != cpu.shape()) {
    return ::testing::AssertionFailure()
           << "shape " << gpu.shape().ToString() << " vs " << cpu.shape().ToString();
  }
  const std::vector<float> c = cpu.Contiguous().To(Dtype::kF32).ToVector<float>();
  return NearScaled(gpu, std::vector<double>(c.begin(), c.end()), tol);
}

std::vector<Dtype> FloatDtypes() { return {Dtype::kF32, Dtype::kBF16, Dtype::kF16}; }

}  // namespace testing
}  // namespace cuda
}  // namespace tensor
