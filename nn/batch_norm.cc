// BatchNorm1d forward and backward: the checks and the fp32 casts of the
// layer around tensor::BatchNorm / BatchNormBackward (tensor/ops/batch_norm.h),
// which run on the CPU or on the input's CUDA device.
#include "nn/batch_norm.h"

#include <cmath>

#include "nn/checkpoint.h"
#include "tensor/error.h"
#include "tensor/memory_ledger.h"
#include "tensor/ops/batch_norm.h"
#include "tensor/ops/elementwise.h"

namespace nn {
namespace {

using tensor::Dtype;

constexpr const char* kOp = "batch_norm1d";

// (C) f32 contiguous copy of a parameter or buffer (no copy when already so).
Tensor F32(const Tensor& t) { return t.To(Dtype::kF32).Contiguous(); }

// A buffer must live where the input does (buffers are not moved with
// the parameters by Materialize).
void CheckBufferDevice(const char* name, const Tensor& buffer, const Tensor& x) {
  OP_CHECK(buffer.device() == x.device(), kOp, name, " ", buffer.shape().ToString(), " is on ",
           buffer.device().ToString(), " but the input ", x.shape().ToString(), " is on ",
           x.device().ToString(), "; move the module's buffers to the input's device");
}

}  // namespace

BatchNorm1d::BatchNorm1d(int64_t num_features, BatchNorm1dOptions options)
    : Module("BatchNorm1d"), c_(num_features), options_(options) {
  OP_CHECK(num_features > 0, kOp, "num_features must be > 0; got ", num_features);
  OP_CHECK(std::isfinite(options.eps) && options.eps >= 0.0f, kOp,
           "eps must be finite and >= 0; got ", options.eps);
  OP_CHECK(options.momentum >= 0.0f && options.momentum <= 1.0f, kOp,
           "momentum must be in [0, 1]; got ", options.momentum);
  if (options.affine) {
    weight_ = RegisterParameter("weight", {c_}, InitSpec::Ones(), /*weight_decay=*/false);
    bias_ = RegisterParameter("bias", {c_}, InitSpec::Zeros(), /*weight_decay=*/false);
  }
  if (options.track_running_stats) {
    // Model state, like the parameters (not this thread's current category).
    tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kParameters);
    running_mean_ = RegisterBuffer("running_mean", Tensor::Zeros({c_}));
    running_var_ = RegisterBuffer("running_var", Tensor::Full({c_}, 1.0));
    num_batches_tracked_ = RegisterBuffer("num_batches_tracked", Tensor::Zeros({}, Dtype::kI64));
  }
}

Tensors BatchNorm1d::Forward(const Tensors& inputs, Context& ctx) {
  const Tensor& x_in = inputs.at(0);
  OP_CHECK(x_in.defined() && (x_in.rank() == 2 || x_in.rank() == 3) && x_in.dim(1) == c_, kOp,
           "input ", x_in.defined() ? x_in.shape().ToString() : "undefined",
           " must be (N, C) or (N, C, L) with C = ", c_);
  OP_CHECK(tensor::IsFloatingPoint(x_in.dtype()), kOp, "input ", x_in.shape().ToString(),
           " has dtype ", tensor::DtypeName(x_in.dtype()), "; expected f32, bf16 or f16");
  const int64_t m = x_in.dim(0) * (x_in.rank() == 3 ? x_in.dim(2) : 1);  // values per channel
  const bool batch_stats = is_training() || !options_.track_running_stats;
  OP_CHECK(!batch_stats || m > 1, kOp, "training needs more than 1 value per channel; got input ",
           x_in.shape().ToString());
  const Tensor x = x_in.To(Dtype::kF32).Contiguous();  // (N, C, L) f32, no copy when already so

  // Running statistics: read in eval, updated in place in training (not while
  // a checkpointed forward is recomputed). f32 views of the buffers, written
  // back when the buffer is stored otherwise.
  const bool use_running = options_.track_running_stats && (!batch_stats || !IsRecomputing());
  tensor::BatchNormRunningStats running;
  if (use_running) {
    CheckBufferDevice("running_mean", *running_mean_, x);
    CheckBufferDevice("running_var", *running_var_, x);
    CheckBufferDevice("num_batches_tracked", *num_batches_tracked_, x);
    running.mean = F32(*running_mean_);
    running.var = F32(*running_var_);
    if (batch_stats) running.num_batches_tracked = *num_batches_tracked_;
  }
  const Tensor w = weight_ != nullptr ? F32(weight_->value) : Tensor();
  const Tensor b = bias_ != nullptr ? F32(bias_->value) : Tensor();
  tensor::BatchNormResult r =
      tensor::BatchNorm(x, w, b, running, batch_stats, options_.momentum, options_.eps);
  if (use_running && batch_stats) {
    if (!running.mean.SharesStorageWith(*running_mean_)) running_mean_->CopyFrom(running.mean);
    if (!running.var.SharesStorageWith(*running_var_)) running_var_->CopyFrom(running.var);
  }
  ctx.Save(Saved{x, r.mean, r.rstd, batch_stats, x_in.dtype(), x_in.shape()});
  return {r.y};
}

Tensors BatchNorm1d::Backward(const Tensors& grad_outputs, Context& ctx) {
  const Saved& sv = ctx.Saved<Saved>();
  const Tensor& g_in = grad_outputs.at(0);
  OP_CHECK(g_in.defined() && g_in.shape() == sv.input_shape, kOp, "grad ",
           g_in.defined() ? g_in.shape().ToString() : "undefined",
           " does not match the forward's input ", sv.input_shape.ToString());
  const Tensor w = weight_ != nullptr ? F32(weight_->value) : Tensor();
  const tensor::BatchNormGrads grads =
      tensor::BatchNormBackward(g_in.To(Dtype::kF32), sv.x, w, sv.mean, sv.rstd, sv.batch_stats);
  if (weight_ != nullptr) {
    if (weight_->requires_grad) tensor::AddInPlace(weight_->GradBuffer(), grads.grad_weight);
    if (bias_->requires_grad) tensor::AddInPlace(bias_->GradBuffer(), grads.grad_bias);
  }
  return {grads.grad_x.To(sv.input_dtype)};
}

}  // namespace nn
