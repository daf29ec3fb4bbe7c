// Activation checkpointing: checkpointed forward, recompute-then-backward,
// and the generator bookkeeping that makes the recompute draw the same numbers.
#include "nn/checkpoint.h"

#include <utility>
#include <vector>

#include "tensor/error.h"
#include "tensor/fnv.h"

namespace nn {
namespace {

thread_local int recompute_depth = 0;
thread_local const Module* recompute_root = nullptr;  // the outermost one recomputed

// Marks the calling thread as recomputing `module` while alive (nests: the
// outermost module stays the root).
class RecomputeScope {
 public:
  explicit RecomputeScope(const Module& module) {
    if (recompute_depth++ == 0) recompute_root = &module;
  }
  ~RecomputeScope() {
    if (--recompute_depth == 0) recompute_root = nullptr;
  }
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;
};

struct GeneratorState {
  RandomSource* source;
  tensor::Generator state;
};

std::vector<GeneratorState> SnapshotGenerators(Module& module) {
  std::vector<GeneratorState> out;
  for (auto& [name, m] : module.NamedModules()) {
    if (auto* source = dynamic_cast<RandomSource*>(m)) out.push_back({source, source->generator()});
  }
  return out;
}

void RestoreGenerators(const std::vector<GeneratorState>& states) {
  for (const GeneratorState& s : states) s.source->generator() = s.state;
}

// Sets the generators to the forward's state while alive, then back to the
// state they had when it was created (also when the recompute throws).
class ReplayGenerators {
 public:
  explicit ReplayGenerators(const std::vector<GeneratorState>& forward_states) {
    now_.reserve(forward_states.size());
    for (const GeneratorState& s : forward_states)
      now_.push_back({s.source, s.source->generator()});
    RestoreGenerators(forward_states);
  }
  ~ReplayGenerators() { RestoreGenerators(now_); }
  ReplayGenerators(const ReplayGenerators&) = delete;
  ReplayGenerators& operator=(const ReplayGenerators&) = delete;

 private:
  std::vector<GeneratorState> now_;
};

// What a checkpointed forward keeps.
struct CheckpointSaved {
  Tensors inputs;                          // the caller's inputs (handles)
  std::vector<GeneratorState> generators;  // RandomSources before the forward
};

// FNV-1a 64 of the name, keyed by the seed.
uint64_t SeedFor(uint64_t seed, const std::string& name) {
  return tensor::Fnv1a64(name, tensor::kFnv1aBasis ^ (seed * 0x9E3779B97F4A7C15ull));
}

}  // namespace

void SeedRandomSources(Module& root, uint64_t seed, uint64_t batch_part, uint64_t batch_parts) {
  OP_CHECK(batch_parts >= 1 && batch_part < batch_parts, "SeedRandomSources", "batch part ",
           batch_part, " of ", batch_parts, " is not in [0, ", batch_parts, ")");
  for (auto& [name, m] : root.NamedModules()) {
    if (auto* source = dynamic_cast<RandomSource*>(m)) {
      source->generator() = tensor::Generator(SeedFor(seed, name), 0);
      source->generator().SetBatchPart(batch_part, batch_parts);
    }
  }
}

bool IsRecomputing() { return recompute_depth > 0; }

const Module* RecomputeRoot() { return recompute_root; }

Tensors CheckpointedRun(Module& module, const Tensors& inputs, Context& ctx) {
  std::vector<GeneratorState> generators = SnapshotGenerators(module);
  Tensors outputs;
  {
    Context inner;  // dropped here: this is the memory checkpointing saves
    outputs = module.Run(inputs, inner);
  }
  ctx.Save(CheckpointSaved{inputs, std::move(generators)});
  return outputs;
}

Tensor CheckpointedRun(Module& module, const Tensor& x, Context& ctx) {
  return CheckpointedRun(module, Tensors{x}, ctx).at(0);
}

Tensors CheckpointedRunBackward(Module& module, const Tensors& grad_outputs, Context& ctx) {
  CheckpointSaved saved = std::move(ctx.Saved<CheckpointSaved>());
  ctx.Clear();
  Context inner;
  {
    ReplayGenerators replay(saved.generators);
    RecomputeScope recomputing(module);
    module.Run(saved.inputs, inner);  // outputs unused: only the context matters
  }
  saved.inputs.clear();  // the recomputed context holds what the backward needs
  return module.RunBackward(grad_outputs, inner);
}

Tensor CheckpointedRunBackward(Module& module, const Tensor& grad_y, Context& ctx) {
  return CheckpointedRunBackward(module, Tensors{grad_y}, ctx).at(0);
}

Tensors RunMaybeCheckpointed(Module& module, bool checkpoint, const Tensors& inputs, Context& ctx) {
  return checkpoint ? CheckpointedRun(module, inputs, ctx) : module.Run(inputs, ctx);
}

Tensors RunBackwardMaybeCheckpointed(Module& module, bool checkpoint, const Tensors& grad_outputs,
                                     Context& ctx) {
  return checkpoint ? CheckpointedRunBackward(module, grad_outputs, ctx)
                    : module.RunBackward(grad_outputs, ctx);
}

}  // namespace nn
