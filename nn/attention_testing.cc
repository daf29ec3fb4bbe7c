// Plain-loop attention references for the attention tests.
#include "nn/attention_testing.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace nn {
namespace testing {

using tensor::Shape;
using tensor::Tensor;

Tensor NaiveAttention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                      const Tensor& key_mask, double scale, bool causal) {
  const int64_t nb = q.dim(0), nh = q.dim(1), t_q = q.dim(2), hs = q.dim(3);
  const int64_t t_k = k.dim(2), hv = v.dim(3);
  const std::vector<float> vq = q.ToVector<float>(), vk = k.ToVector<float>(),
                           vv = v.ToVector<float>();
  const std::vector<float> vb = bias.defined() ? bias.ToVector<float>() : std::vector<float>();
  const std::vector<float> vm =
      key_mask.defined() ? key_mask.ToVector<float>() : std::vector<float>();
  const bool bias_batched = bias.defined() && bias.dim(0) == nb && nb > 1;
  std::vector<float> out(nb * nh * t_q * hv, 0.0f);
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t h = 0; h < nh; ++h) {
      for (int64_t i = 0; i < t_q; ++i) {
        std::vector<double> s(t_k);
        std::vector<bool> seen(t_k);
        double mx = -INFINITY;
        for (int64_t j = 0; j < t_k; ++j) {
          seen[j] = (!causal || j <= i + t_k - t_q) && (vm.empty() || vm[b * t_k + j] != 0.0f);
          if (!seen[j]) continue;
          double dot = 0;
          for (int64_t d = 0; d < hs; ++d) {
            dot += static_cast<double>(vq[((b * nh + h) * t_q + i) * hs + d]) *
                   vk[((b * nh + h) * t_k + j) * hs + d];
          }
          s[j] = scale * dot;
          if (!vb.empty()) s[j] += vb[(((bias_batched ? b : 0) * nh + h) * t_q + i) * t_k + j];
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < t_k; ++j) {
          s[j] = seen[j] ? std::exp(s[j] - mx) : 0.0;
          sum += s[j];
        }
        if (sum == 0) continue;  // no visible key: output 0
        for (int64_t d = 0; d < hv; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < t_k; ++j)
            acc += s[j] / sum * vv[((b * nh + h) * t_k + j) * hv + d];
          out[((b * nh + h) * t_q + i) * hv + d] = static_cast<float>(acc);
        }
      }
    }
  }
  return Tensor::FromVector(out, {nb, nh, t_q, hv});
}

Tensor NaiveLinear(const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t out_f = w.dim(0), in_f = w.dim(1);
  const int64_t rows = x.numel() / in_f;
  const std::vector<float> vx = x.ToVector<float>(), vw = w.ToVector<float>();
  const std::vector<float> vb = b.defined() ? b.ToVector<float>() : std::vector<float>();
  std::vector<float> y(rows * out_f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out_f; ++o) {
      double acc = vb.empty() ? 0.0 : vb[o];
      for (int64_t c = 0; c < in_f; ++c) {
        acc += static_cast<double>(vx[r * in_f + c]) * vw[o * in_f + c];
      }
      y[r * out_f + o] = static_cast<float>(acc);
    }
  }
  Shape shape = x.shape();
  shape[shape.rank() - 1] = out_f;
  return Tensor::FromVector(y, shape);
}

Tensor NaiveSplitHeads(const Tensor& x, int64_t n_heads) {
  const int64_t nb = x.dim(0), t = x.dim(1), c = x.dim(2), hs = c / n_heads;
  const std::vector<float> vx = x.ToVector<float>();
  std::vector<float> out(vx.size());
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t h = 0; h < n_heads; ++h) {
        for (int64_t d = 0; d < hs; ++d) {
          out[((b * n_heads + h) * t + i) * hs + d] = vx[(b * t + i) * c + h * hs + d];
        }
      }
    }
  }
  return Tensor::FromVector(out, {nb, n_heads, t, hs});
}

Tensor NaiveMergeHeads(const Tensor& x) {
  const int64_t nb = x.dim(0), nh = x.dim(1), t = x.dim(2), hs = x.dim(3);
  const std::vector<float> vx = x.ToVector<float>();
  std::vector<float> out(vx.size());
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t h = 0; h < nh; ++h) {
      for (int64_t i = 0; i < t; ++i) {
        for (int64_t d = 0; d < hs; ++d) {
          out[(b * t + i) * nh * hs + h * hs + d] = vx[((b * nh + h) * t + i) * hs + d];
        }
      }
    }
  }
  return Tensor::FromVector(out, {nb, t, nh * hs});
}

}  // namespace testing
}  // namespace nn
