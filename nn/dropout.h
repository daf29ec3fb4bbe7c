// Dropout layer: inverted dropout with a generator owned by the layer. The
// mask is never stored: the backward regenerates it from the saved
// DropoutState (seed and Philox offset), see tensor/ops/dropout.h.
#ifndef NN_DROPOUT_H_
#define NN_DROPOUT_H_

#include <cstdint>

#include "nn/checkpoint.h"
#include "nn/module.h"
#include "tensor/ops/dropout.h"
#include "tensor/random.h"

namespace nn {

// Identity in eval mode and for p == 0. Each training forward reserves fresh
// counters of the generator, so successive calls draw different masks;
// activation checkpointing replays them through the RandomSource interface.
// Layers built with the same seed draw the same streams: give models distinct
// seeds per layer with SeedRandomSources (nn/checkpoint.h) or set_seed.
class Dropout : public Module, public RandomSource {
 public:
  // p in [0, 1] (throws OpError otherwise).
  explicit Dropout(float p, uint64_t seed = 0);

  float p() const { return p_; }
  // Whether Forward changes its input: p > 0 in training mode (else it
  // returns x itself and draws nothing).
  bool active() const { return p_ > 0.0f && is_training(); }
  // Restarts the generator at (seed, offset 0).
  void set_seed(uint64_t seed) { gen_ = tensor::Generator(seed, 0); }
  tensor::Generator& generator() override { return gen_; }

 protected:
  // inputs[0]: x (...) floating -> (...) same dtype (x itself when inactive).
  // With inputs[1], a residual shaped as x: residual + dropout(x) in one pass
  // (tensor::DropoutAdd), in the residual's dtype: a branch joining its
  // stream.
  Tensors Forward(const Tensors& inputs, Context& ctx) override;
  // grad (...) -> grad * mask / (1 - p), in x's dtype; with a residual, its
  // gradient (grad itself) follows.
  Tensors Backward(const Tensors& grad_outputs, Context& ctx) override;

 private:
  struct Saved {
    tensor::DropoutState state;
    tensor::Dtype input_dtype;
    bool has_residual = false;
  };
  const float p_;
  tensor::Generator gen_;
};

}  // namespace nn

#endif  // NN_DROPOUT_H_
