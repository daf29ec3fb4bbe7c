// The shared helpers of the fused attention tests (attention_testing.h).
#include "tensor/cuda/attention_testing.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tensor/cuda/testing.h"
#include "tensor/testing.h"

namespace tensor {
namespace cuda {
namespace attention_testing {

using testing::NearScaled;
using testing::ToGpu;
using ::tensor::testing::RandomTensor;

std::string Name(const Case& c, Dtype dt, FlashAttentionKernel k) {
  return absl::StrCat("B", c.b, " H", c.h, " Tq", c.t_q, " Tk", c.t_k, " D", c.d,
                      c.causal ? " causal " : " full ", DtypeName(dt),
                      k == FlashAttentionKernel::kFloat ? " float" : " tensor-core");
}

Reference Compute(const Case& c, const std::vector<float>& q, const std::vector<float>& k,
                  const std::vector<float>& v, const std::vector<float>& dout, double scale,
                  const Terms& terms) {
  const int64_t bh = c.b * c.h, tq = c.t_q, tk = c.t_k, d = c.d;
  Reference r;
  r.out.assign(bh * tq * d, 0.0);
  r.lse.assign(bh * tq, -INFINITY);
  r.dq.assign(bh * tq * d, 0.0);
  r.dk.assign(bh * tk * d, 0.0);
  r.dv.assign(bh * tk * d, 0.0);
  r.dscores.assign(bh * tq * tk, 0.0);
  std::vector<double> p(tk), dp(tk);
  std::vector<bool> seen(tk);
  for (int64_t n = 0; n < bh; ++n) {
    const int64_t b = n / c.h, h = n % c.h;
    const float* qn = q.data() + n * tq * d;
    const float* kn = k.data() + n * tk * d;
    const float* vn = v.data() + n * tk * d;
    const float* don = dout.data() + n * tq * d;
    const float* bn =
        terms.bias.empty()
            ? nullptr
            : terms.bias.data() + ((terms.bias_batch == 1 ? 0 : b) * c.h + h) * tq * tk;
    for (int64_t i = 0; i < tq; ++i) {
      const int64_t limit = c.causal ? std::min(tk, i + (tk - tq) + 1) : tk;  // keys < limit
      double m = -INFINITY;
      for (int64_t j = 0; j < tk; ++j) {
        seen[j] = j < limit && (terms.keep.empty() || terms.keep[b * tk + j] != 0.0f);
        if (!seen[j]) continue;
        double s = 0;
        for (int64_t x = 0; x < d; ++x) s += double(qn[i * d + x]) * kn[j * d + x];
        p[j] = s * scale + (bn != nullptr ? bn[i * tk + j] : 0.0);
        m = std::max(m, p[j]);
      }
      if (m == -INFINITY) continue;  // no key: out 0, lse -inf, no gradient
      double sum = 0;
      for (int64_t j = 0; j < tk; ++j) sum += seen[j] ? (p[j] = std::exp(p[j] - m)) : 0.0;
      for (int64_t j = 0; j < tk; ++j) p[j] = seen[j] ? p[j] / sum : 0.0;
      r.lse[n * tq + i] = m + std::log(sum);
      double delta = 0;
      for (int64_t j = 0; j < tk; ++j) {
        if (!seen[j]) continue;
        double s = 0;
        for (int64_t x = 0; x < d; ++x) {
          r.out[(n * tq + i) * d + x] += p[j] * vn[j * d + x];
          s += double(don[i * d + x]) * vn[j * d + x];
        }
        dp[j] = s;
        delta += p[j] * s;
      }
      for (int64_t j = 0; j < tk; ++j) {
        if (!seen[j]) continue;
        const double dsc = p[j] * (dp[j] - delta);
        r.dscores[(n * tq + i) * tk + j] = dsc;
        const double ds = dsc * scale;
        for (int64_t x = 0; x < d; ++x) {
          r.dq[(n * tq + i) * d + x] += ds * kn[j * d + x];
          r.dk[(n * tk + j) * d + x] += ds * qn[i * d + x];
          r.dv[(n * tk + j) * d + x] += p[j] * don[i * d + x];
        }
      }
    }
  }
  return r;
}

double Tol(Dtype dt) { return dt == Dtype::kBF16 ? 2e-2 : dt == Dtype::kF16 ? 5e-3 : 1e-4; }

Tensor GpuView(const Shape& bhtd, uint64_t seed, Dtype dt, bool unaligned) {
  const int64_t b = bhtd[0], h = bhtd[1], t = bhtd[2], d = bhtd[3];
  if (unaligned) {
    const Tensor base = ToGpu(RandomTensor({b, h, t, d + 1}, seed, -1.0f, 1.0f, dt));
    return base.Narrow(3, 1, d);
  }
  return ToGpu(RandomTensor({b, t, h, d}, seed, -1.0f, 1.0f, dt)).Transpose(1, 2);
}

// The kernels' results against the reference (lse is f32 whatever the dtype).
void ExpectNear(const Reference& ref, const Tensor& out, const Tensor& lse, const Tensor& dq,
                const Tensor& dk, const Tensor& dv, double tol) {
  EXPECT_TRUE(NearScaled(out, ref.out, tol)) << "out";
  EXPECT_TRUE(NearScaled(lse, ref.lse, 1e-4)) << "lse";
  EXPECT_TRUE(NearScaled(dq, ref.dq, tol)) << "dq";
  EXPECT_TRUE(NearScaled(dk, ref.dk, tol)) << "dk";
  EXPECT_TRUE(NearScaled(dv, ref.dv, tol)) << "dv";
}

// scale 0: 1 / sqrt(D).
void RunCase(const Case& c, Dtype dt, FlashAttentionKernel kernel, bool unaligned,
             float scale) {
  if (scale == 0.0f) scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  SCOPED_TRACE(absl::StrCat(Name(c, dt, kernel), unaligned ? " unaligned" : "", " scale ", scale));
  const Tensor q = GpuView({c.b, c.h, c.t_q, c.d}, 1, dt, unaligned);
  const Tensor k = GpuView({c.b, c.h, c.t_k, c.d}, 2, dt, unaligned);
  const Tensor v = GpuView({c.b, c.h, c.t_k, c.d}, 3, dt, unaligned);
  const Tensor dout = GpuView({c.b, c.h, c.t_q, c.d}, 4, dt, unaligned);
  const Device dev = q.device();
  Tensor out = Tensor::Empty({c.b, c.h, c.t_q, c.d}, dt, dev);
  Tensor lse = Tensor::Empty({c.b, c.h, c.t_q}, Dtype::kF32, dev);
  FlashAttentionForward(q, k, v, scale, c.causal, out, lse, kernel);
  Tensor dq = Tensor::Empty(q.shape(), dt, dev);
  Tensor dk = Tensor::Empty(k.shape(), dt, dev);
  Tensor dv = Tensor::Empty(v.shape(), dt, dev);
  FlashAttentionBackward(q, k, v, out, lse, dout, scale, c.causal, dq, dk, dv, kernel);

  const Reference ref = Compute(c, q.ToVector<float>(), k.ToVector<float>(), v.ToVector<float>(),
                                dout.ToVector<float>(), scale);
  ExpectNear(ref, out, lse, dq, dk, dv, Tol(dt));
}

}  // namespace attention_testing
}  // namespace cuda
}  // namespace tensor
