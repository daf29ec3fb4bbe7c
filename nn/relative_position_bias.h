// RelativePositionBias: T5's learned attention bias, one scalar per (bucket,
// head), where the bucket of a (query i, key j) pair depends only on the
// relative position j - i (Mesh TensorFlow / Hugging Face
// `_relative_position_bucket`): half of the buckets hold exact small distances,
// the other half log-spaced distances up to max_distance; bidirectional
// (encoder) bucketing splits the buckets between keys before and after the
// query, unidirectional (decoder) bucketing only counts keys before it.
//
// The parameter is `weight` (n_buckets, n_heads), so inside T5Attention (child
// `relative_attention_bias`) it is named `relative_attention_bias.weight` as in
// Hugging Face checkpoints.
#ifndef NN_RELATIVE_POSITION_BIAS_H_
#define NN_RELATIVE_POSITION_BIAS_H_

#include <cstdint>

#include "nn/module.h"

namespace nn {

// The bucket of relative position `relative_position` = key position - query
// position, exactly as Hugging Face's T5Attention._relative_position_bucket
// (float32 arithmetic, truncation toward zero). n_buckets >= 2 (even when
// bidirectional), max_distance > the exact range.
int64_t RelativePositionBucket(int64_t relative_position, bool bidirectional, int64_t n_buckets,
                               int64_t max_distance);

struct RelativePositionBiasOptions {
  int64_t n_buckets = 32;
  int64_t max_distance = 128;
  // Hugging Face: normal(0, initializer_factor * d_model^-0.5); T5Attention sets it.
  InitSpec init = InitSpec::Normal(0.0f, 1.0f);
};

class RelativePositionBias : public Module {
 public:
  RelativePositionBias(int64_t n_heads, bool bidirectional,
                       RelativePositionBiasOptions options = {});

  // (T_q, T_k) i64: key position j minus query position (i + query_offset).
  // query_offset > 0 places the queries after the start of the keys
  // (decoding with earlier keys).
  static Tensor RelativePositions(int64_t t_q, int64_t t_k, int64_t query_offset = 0);

  // Shorthand for Run({RelativePositions(t_q, t_k, query_offset)}, ctx)[0]:
  // the bias (1, n_heads, T_q, T_k).
  using Module::Run;
  Tensor Run(int64_t t_q, int64_t t_k, Context& ctx, int64_t query_offset = 0);

  int64_t n_heads() const { return n_heads_; }
  int64_t n_buckets() const { return n_buckets_; }
  int64_t max_distance() const { return max_distance_; }
  bool bidirectional() const { return bidirectional_; }
  Parameter* weight() { return weight_; }

 protected:
  // inputs[0]: relative positions (T_q, T_k), i32 or i64 ->
  // {bias (1, n_heads, T_q, T_k)} in the weight's dtype (contiguous).
  Tensors Forward(const Tensors& inputs, Context& ctx) override;
  // grad (1, n_heads, T_q, T_k) -> {undefined} (integer input); scatters the
  // gradient into weight.grad (fp32): row bucket(j - i) column h gets the sum
  // of grad[0, h, i, j] over the pairs (i, j) in that bucket.
  Tensors Backward(const Tensors& grad_outputs, Context& ctx) override;

 private:
  struct Saved {
    Tensor buckets;  // (T_q, T_k) i64
  };
  // The bucket ids of positions (T_q, T_k) on `device` (a host i64 tensor in).
  Tensor BucketsOn(const Tensor& positions, tensor::Device device);
  // On a GPU: the last bucket table moved there and the host positions it was
  // made from. Every step of a fixed length asks for the same grid, and
  // reusing the table spares a copy to the device (a host wait) per forward.
  // Charged as the module's state (kParameters); one per module, so ranks as
  // threads (each with its own model) never share it.
  struct DeviceBuckets {
    Tensor positions;  // (T_q, T_k) i64, host: the key
    Tensor buckets;    // (T_q, T_k) i64 on the device
  };
  DeviceBuckets device_buckets_;

  const int64_t n_heads_;
  const int64_t n_buckets_;
  const int64_t max_distance_;
  const bool bidirectional_;
  Parameter* weight_;  // (n_buckets, n_heads)
};

}  // namespace nn

#endif  // NN_RELATIVE_POSITION_BIAS_H_
