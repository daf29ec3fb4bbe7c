// Activation checkpointing: run a module's forward keeping only its inputs,
// and recompute the forward in backward to rebuild what its backward needs.
//
// Design (parameter names stay unchanged). Checkpointing is a way of *calling*
// a child, not a wrapper module: the child stays registered in its parent
// under its own name ("h.3"), so every parameter keeps its Hugging Face name
// ("transformer.h.3.attn.c_attn.weight"); a wrapper module would insert a name
// segment of its own. A parent checkpoints a child by calling
//   CheckpointedRun(child, inputs, ctx.Child(i))          instead of child.Run
//   CheckpointedRunBackward(child, grads, ctx.Child(i))   instead of child.RunBackward
// The containers in nn/containers.h (Sequential, ModuleList, Residual) do this
// per child when flagged, and nn::ApplyCheckpointing(root, predicate) flags
// the children of containers that match a predicate (e.g. every "Block").
//
// Randomness: modules that draw random numbers in Forward (Dropout) implement
// RandomSource. The forward records their generators' (seed, offset); the
// recompute in backward sets them back, so it draws exactly the same masks,
// and then restores the generators' state of that moment.
//
// Side effects: while a recompute runs, IsRecomputing() is true; modules with
// side effects in Forward (BatchNorm's running statistics) skip them then, so
// a checkpointed step updates them once, as an ordinary one does.
//
// Hooks: the recompute calls module.Run, so its hooks (PreForward and
// PostForward) fire a second time, inside the backward; hooks that treat a
// forward during backward differently (FSDP need not reshard right before
// the backward that follows) can test IsRecomputing().
#ifndef NN_CHECKPOINT_H_
#define NN_CHECKPOINT_H_

#include <cstdint>

#include "nn/module.h"
#include "tensor/random.h"

namespace nn {

// A module that draws random numbers in Forward from a generator it owns.

// Gives every RandomSource under `root` (root included) a fresh generator
// whose seed is derived from `seed` and the module's dotted name, at offset 0:
// distinct, reproducible streams per layer (layers built with the same
// default seed would otherwise draw identical masks). The forward that
// follows runs part `batch_part` of `batch_parts` equal parts of a batch (a
// data-parallel rank's micro-batch: Generator::SetBatchPart), so it draws the
// masks one forward over the whole batch gives those rows: dropout is then a
// function of the global row, whatever the ranks and micro-batches, and no
// two ranks draw the same masks. OpError unless batch_part < batch_parts.
void SeedRandomSources(Module& root, uint64_t seed, uint64_t batch_part = 0,
                       uint64_t batch_parts = 1);

// True while a checkpointed module's forward is being recomputed (on this thread).
bool IsRecomputing();
// The outermost module whose forward is being recomputed on this thread (its
// backward follows at once; the modules inside it run their backwards
// later), or nullptr when none is.
const Module* RecomputeRoot();

// Runs module.Forward (through module.Run) with a context of its own that is
// dropped at once; `ctx` keeps only the inputs (handles, no copy) and the
// state of the RandomSources under `module`. Returns the module's outputs.
Tensors CheckpointedRun(Module& module, const Tensors& inputs, Context& ctx);
Tensor CheckpointedRun(Module& module, const Tensor& x, Context& ctx);

// Recomputes the forward from the saved inputs with a fresh context (same
// random numbers, no side effects), then runs module.RunBackward on it. Clears
// `ctx`. Returns the gradients of the inputs, as module.RunBackward does.
Tensors CheckpointedRunBackward(Module& module, const Tensors& grad_outputs, Context& ctx);
Tensor CheckpointedRunBackward(Module& module, const Tensor& grad_y, Context& ctx);

// module.Run / RunBackward, or their checkpointed versions when `checkpoint`.
Tensors RunMaybeCheckpointed(Module& module, bool checkpoint, const Tensors& inputs, Context& ctx);
Tensors RunBackwardMaybeCheckpointed(Module& module, bool checkpoint, const Tensors& grad_outputs,
                                     Context& ctx);

}  // namespace nn

#endif  // NN_CHECKPOINT_H_
