// RelativePositionBias: T5's bucketing function, the bias lookup and its
// scatter-add backward.
#include "nn/relative_position_bias.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tensor/memory_ledger.h"
#include "tensor/ops/check.h"
#include "tensor/ops/embedding.h"

namespace nn {
namespace {

constexpr char kOp[] = "relative_position_bias";

// Throws unless the bucketing arguments leave at least one exact bucket and a
// log range above it (else Hugging Face's formula divides by log(1) or log(x/0)).
void CheckBucketArgs(bool bidirectional, int64_t n_buckets, int64_t max_distance) {
  const int64_t half = bidirectional ? n_buckets / 2 : n_buckets;
  OP_CHECK(n_buckets >= 2 && (!bidirectional || n_buckets % 2 == 0) && half / 2 >= 1, kOp,
           "n_buckets must be >= 2 (and even when bidirectional) with at least one exact bucket; "
           "got n_buckets ",
           n_buckets, (bidirectional ? " (bidirectional)" : " (unidirectional)"));
  OP_CHECK(max_distance > half / 2, kOp, "max_distance ", max_distance,
           " must exceed the exact range ", half / 2, " (n_buckets ", n_buckets, ")");
}

// RelativePositionBucket for arguments already checked.
int64_t Bucket(int64_t relative_position, bool bidirectional, int64_t n_buckets,
               int64_t max_distance) {
  int64_t bucket = 0;
  int64_t buckets = n_buckets;
  int64_t n;  // the distance that is bucketed, >= 0
  if (bidirectional) {
    buckets /= 2;
    if (relative_position > 0) bucket += buckets;  // keys after the query
    n = relative_position < 0 ? -relative_position : relative_position;
  } else {
    n = relative_position < 0 ? -relative_position : 0;  // -min(rel, 0): keys after count as 0
  }
  const int64_t max_exact = buckets / 2;
  if (n < max_exact) return bucket + n;
  // Log-spaced buckets: max_exact + trunc(log(n / max_exact) / log(max_distance / max_exact)
  // * (buckets - max_exact)), in float32 like the reference (the divisor is a
  // Python double there, applied to a float32 tensor), capped at the last bucket.
  const float ratio = static_cast<float>(n) / static_cast<float>(max_exact);
  const float log_range = static_cast<float>(
      std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)));
  const float scaled = std::log(ratio) / log_range * static_cast<float>(buckets - max_exact);
  const int64_t large = std::min<int64_t>(max_exact + static_cast<int64_t>(scaled), buckets - 1);
  return bucket + large;
}

}  // namespace

int64_t RelativePositionBucket(int64_t relative_position, bool bidirectional, int64_t n_buckets,
                               int64_t max_distance) {
  CheckBucketArgs(bidirectional, n_buckets, max_distance);
  return Bucket(relative_position, bidirectional, n_buckets, max_distance);
}

RelativePositionBias::RelativePositionBias(int64_t n_heads, bool bidirectional,
                                           RelativePositionBiasOptions options)
    : Module("RelativePositionBias"),
      n_heads_(n_heads),
      n_buckets_(options.n_buckets),
      max_distance_(options.max_distance),
      bidirectional_(bidirectional) {
  OP_CHECK(n_heads > 0, kOp, "n_heads must be positive; got ", n_heads);
  CheckBucketArgs(bidirectional, n_buckets_, max_distance_);
  weight_ = RegisterParameter("weight", {n_buckets_, n_heads_}, options.init,
                              /*weight_decay=*/false);
}

Tensor RelativePositionBias::RelativePositions(int64_t t_q, int64_t t_k, int64_t query_offset) {
  OP_CHECK(t_q >= 0 && t_k >= 0, kOp, "lengths must be >= 0; got T_q ", t_q, " and T_k ", t_k);
  Tensor rel = Tensor::Empty({t_q, t_k}, tensor::Dtype::kI64);  // (T_q, T_k)
  int64_t* p = rel.data<int64_t>();
  for (int64_t i = 0; i < t_q; ++i) {
    for (int64_t j = 0; j < t_k; ++j) p[i * t_k + j] = j - (i + query_offset);
  }
  return rel;
}

Tensor RelativePositionBias::Run(int64_t t_q, int64_t t_k, Context& ctx, int64_t query_offset) {
  return Run(Tensors{RelativePositions(t_q, t_k, query_offset)}, ctx).at(0);
}

Tensor RelativePositionBias::BucketsOn(const Tensor& positions, tensor::Device device) {
  const Tensor rel64 = positions.To(tensor::Device::Cpu()).To(tensor::Dtype::kI64).Contiguous();
  const int64_t n = rel64.numel();
  const int64_t* r = rel64.data<int64_t>();
  if (device.is_cuda()) {
    const Tensor& key = device_buckets_.positions;
    if (key.defined() && key.shape() == rel64.shape() &&
        device_buckets_.buckets.device() == device && std::equal(r, r + n, key.data<int64_t>())) {
      return device_buckets_.buckets;
    }
  }
  // Bucket ids (T_q, T_k), through a table over the range of relative
  // positions present (T_q + T_k - 1 values for the usual j - i grid), on the
  // host.
  Tensor buckets = Tensor::Empty(rel64.shape(), tensor::Dtype::kI64);
  int64_t* b = buckets.data<int64_t>();
  if (n > 0) {
    const auto [lo, hi] = std::minmax_element(r, r + n);
    const int64_t min_rel = *lo;
    // Bucket() maps every other position into [0, n_buckets) (its distance
    // -min_rel must not overflow), which lets the GPU lookup skip its id check.
    OP_CHECK(min_rel > std::numeric_limits<int64_t>::min(), kOp,
             "relative positions must be > -2^63; got ", min_rel);
    // (unsigned: the span of extreme positions must not overflow)
    if (static_cast<uint64_t>(*hi) - static_cast<uint64_t>(min_rel) <
        static_cast<uint64_t>(4 * n)) {
      std::vector<int64_t> table(*hi - min_rel + 1);
      for (size_t d = 0; d < table.size(); ++d) {
        table[d] =
            Bucket(min_rel + static_cast<int64_t>(d), bidirectional_, n_buckets_, max_distance_);
      }
      for (int64_t i = 0; i < n; ++i) b[i] = table[r[i] - min_rel];
    } else {  // sparse, arbitrary positions
      for (int64_t i = 0; i < n; ++i) {
        b[i] = Bucket(r[i], bidirectional_, n_buckets_, max_distance_);
      }
    }
  }
  if (!device.is_cuda()) return buckets.To(device);
  tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kParameters);
  device_buckets_ = DeviceBuckets();  // the old table goes first
  device_buckets_.buckets = buckets.To(device);
  device_buckets_.positions = rel64.Clone();  // the caller may reuse its tensor
  return device_buckets_.buckets;
}

Tensors RelativePositionBias::Forward(const Tensors& inputs, Context& ctx) {
  OP_CHECK(inputs.size() == 1 && inputs[0].defined(), kOp,
           "expects one input, the relative positions (T_q, T_k); got ", inputs.size(), " inputs");
  const Tensor& rel = inputs[0];
  OP_CHECK(
      rel.rank() == 2 && (rel.dtype() == tensor::Dtype::kI64 || rel.dtype() == tensor::Dtype::kI32),
      kOp, "relative positions must be (T_q, T_k) i32 or i64; got ",
      tensor::Describe("relative_positions", rel));
  const Tensor& w = weight_->value;  // (n_buckets, n_heads)
  OP_CHECK(w.defined(), kOp, "weight is not materialized");
  const Tensor buckets = BucketsOn(rel, w.device());  // (T_q, T_k) i64
  // (T_q, T_k, nh) rows of the table -> (1, nh, T_q, T_k).
  const Tensor rows = tensor::Embedding(w, buckets, /*ids_checked=*/true);  // ids of Bucket()
  Tensor bias = rows.Transpose(0, 2).Transpose(1, 2).Contiguous().Unsqueeze(0);
  ctx.Save(Saved{buckets});
  return {bias};
}

Tensors RelativePositionBias::Backward(const Tensors& grad_outputs, Context& ctx) {
  Saved& s = ctx.Saved<Saved>();
  const Tensor& g = grad_outputs.at(0);  // (1, nh, T_q, T_k)
  const tensor::Shape expected{1, n_heads_, s.buckets.dim(0), s.buckets.dim(1)};
  OP_CHECK(g.defined() && g.shape() == expected, kOp, "grad ",
           g.defined() ? g.shape().ToString() : "undefined", " does not match the bias ",
           expected.ToString());
  if (!weight_->requires_grad) return {Tensor()};  // frozen: no gradient to compute
  // (1, nh, T_q, T_k) -> (T_q, T_k, nh) rows, summed into the table rows by bucket.
  const Tensor rows = g.Select(0, 0).Transpose(0, 1).Transpose(1, 2).Contiguous();
  // The forward's lookup checked the buckets: a GPU does not check again.
  tensor::EmbeddingBackwardAccumulate(rows, s.buckets, weight_->GradBuffer(),
                                      /*ids_checked=*/true);
  return {Tensor()};
}

}  // namespace nn
