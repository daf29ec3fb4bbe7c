// BatchNorm1d: batch normalization over the channel dimension of (N, C) or
// (N, C, L) inputs, as torch.nn.BatchNorm1d.
//
// Training normalizes with the batch's statistics (biased variance) and
// updates the running statistics with the unbiased variance:
//   running = (1 - momentum) * running + momentum * batch;
// eval normalizes with the running statistics. The layer always computes in
// fp32 (its class name "BatchNorm1d" is in MixedPrecisionPolicy's default
// fp32 module list): inputs of other dtypes are cast to f32, the output is
// f32 (the next layer casts as it needs), parameters are read as f32 whatever
// their storage dtype, and the input's gradient comes back in the caller's
// dtype. The running statistics are not updated while a checkpointed forward
// is recomputed (nn::IsRecomputing), so a checkpointed step updates them once.
// The math is tensor::BatchNorm (tensor/ops/batch_norm.h): on the CPU, or on
// the input's CUDA device, where the parameters and the buffers must be too.
#ifndef NN_BATCH_NORM_H_
#define NN_BATCH_NORM_H_

#include <cstdint>

#include "nn/module.h"

namespace nn {

struct BatchNorm1dOptions {
  float eps = 1e-5f;
  float momentum = 0.1f;
  // Learnable weight (init ones) and bias (init zeros).
  bool affine = true;
  // Running statistics (buffers running_mean, running_var, num_batches_tracked);
  // without them eval mode also uses the batch's statistics.
  bool track_running_stats = true;
};

class BatchNorm1d : public Module {
 public:
  explicit BatchNorm1d(int64_t num_features, BatchNorm1dOptions options = {});

  int64_t num_features() const { return c_; }
  Parameter* weight() { return weight_; }  // nullptr without affine
  Parameter* bias() { return bias_; }      // nullptr without affine
  // (C) f32, (C) f32 and () i64, or nullptr without track_running_stats.
  Tensor* running_mean() { return running_mean_; }
  Tensor* running_var() { return running_var_; }
  Tensor* num_batches_tracked() { return num_batches_tracked_; }

 protected:
  // inputs[0]: x (N, C) or (N, C, L), floating -> (N, C) or (N, C, L) f32.
  Tensors Forward(const Tensors& inputs, Context& ctx) override;
  // grad (x's shape) -> grad_x in x's dtype; accumulates weight/bias grads.
  Tensors Backward(const Tensors& grad_outputs, Context& ctx) override;

 private:
  struct Saved {
    Tensor x;          // (N, C, L) f32 contiguous
    Tensor mean;       // (C) f32: the statistics used to normalize
    Tensor rstd;       // (C) f32: 1 / sqrt(var + eps)
    bool batch_stats;  // true when mean/rstd came from this batch
    tensor::Dtype input_dtype;
    tensor::Shape input_shape;
  };
  const int64_t c_;
  const BatchNorm1dOptions options_;
  Parameter* weight_ = nullptr;  // (C)
  Parameter* bias_ = nullptr;    // (C)
  Tensor* running_mean_ = nullptr;
  Tensor* running_var_ = nullptr;
  Tensor* num_batches_tracked_ = nullptr;
};

}  // namespace nn

#endif  // NN_BATCH_NORM_H_
