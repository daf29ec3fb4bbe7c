// Inverted dropout: in training each element is kept with probability 1 - p
// and scaled by 1 / (1 - p), else zeroed. The mask is never stored: it is a
// function of (seed, offset) through the counter-based Philox generator
// (tensor/random.h), so the backward regenerates it and the result does not
// depend on the thread count.
//
// Mask definition: element i (row-major index in x) uses Philox4x32 word
// i % 4 of counter offset + i / 4 under key seed, and is kept iff
// (word >> 8) * 2^-24 >= p (the generator's 24-bit uniform, UniformFromBits).
// A forward reserves ceil(numel / 4) counters of the generator.
#ifndef TENSOR_OPS_DROPOUT_H_
#define TENSOR_OPS_DROPOUT_H_

#include <array>
#include <cstdint>

#include "tensor/random.h"
#include "tensor/tensor.h"

namespace tensor {

// What the backward needs (a few bytes instead of a mask).
struct DropoutState {
  float p = 0.0f;        // drop probability in [0, 1]
  uint64_t seed = 0;     // Philox key
  uint64_t offset = 0;   // first Philox counter
  int64_t numel = 0;     // elements of x (the backward checks grad_y against it)
  // false when the forward was the identity (eval mode or p == 0): the backward
  // then passes the gradient through.
  bool active = false;
};

struct DropoutResult {
  Tensor y;  // x's shape and dtype; x itself (no copy) when state.active is false
  DropoutState state;
};

// The state of a dropout over `numel` elements: inactive when training is
// false or p == 0; otherwise active, and for p < 1 it reserves the
// ceil(numel / 4) counters of `gen` the mask uses. Dropout draws its state
// here; kernels that apply the mask themselves (the fused CUDA attention)
// draw theirs here too, so they get the mask Dropout would. p outside
// [0, 1] throws OpError.
DropoutState DrawDropoutState(int64_t numel, float p, Generator& gen, bool training);

// x floating (f32, bf16, f16). training false or p == 0: y is x; p == 1: zeros;
// p outside [0, 1] throws OpError.
DropoutResult Dropout(const Tensor& x, float p, Generator& gen, bool training = true);

// residual + Dropout(x) in one pass: a residual branch joining its stream
// (a transformer block's attention and MLP outputs). The mask and the state
// are Dropout's (drawn from `gen` the same way), y has residual's shape and
// dtype (x's may differ), each element computed in f32 as residual + x * (1 /
// (1 - p)) (or residual + 0 where dropped) and rounded once; f32 gives
// Add(residual, Dropout(x).y)'s bits. Inactive: Add(residual, x).
// The backward is DropoutBackward for x and the gradient itself for residual.
DropoutResult DropoutAdd(const Tensor& residual, const Tensor& x, float p, Generator& gen,
                         bool training = true);

// grad_x = grad_y * mask / (1 - p) with the forward's mask (grad_y itself when
// the forward was the identity; zeros for p == 1).
Tensor DropoutBackward(const Tensor& grad_y, const DropoutState& state);

// DropoutBackward of two tensors of the forward's shape (dtypes may differ),
// generating each block of the mask once for both: {a * mask / (1 - p),
// b * mask / (1 - p)}. The attention backward's two uses of its dropout: the
// dropped probabilities and the gradient through the dropout.
std::array<Tensor, 2> DropoutBackwardOfBoth(const Tensor& a, const Tensor& b,
                                            const DropoutState& state);
// The keep mask (1 kept, 0 dropped) of a forward over `shape`, as u8; all ones
// when the state is inactive.
Tensor DropoutMask(const Shape& shape, const DropoutState& state);

}  // namespace tensor

#endif  // TENSOR_OPS_DROPOUT_H_
