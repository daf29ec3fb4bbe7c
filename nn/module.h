// nn::Module: the unit of a model. A module owns named parameters, buffers and
// child modules, and implements Forward and Backward explicitly; what backward
// needs is saved in a per-call Context that the caller owns. Containers run
// children in order in Forward and in reverse in Backward, so the order of work
// (and of memory) is static and readable, which FSDP relies on.
//
// Callers invoke modules through Run / RunBackward, which also run the hooks a
// wrapper installed (FSDP all-gathers before a unit's forward and
// reduce-scatters after its backward this way) and set the memory category
// (activations in forward, temporaries in backward).
#ifndef NN_MODULE_H_
#define NN_MODULE_H_

#include <any>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "nn/parameter.h"
#include "tensor/random.h"
#include "tensor/tensor.h"

namespace nn {

using tensor::Tensor;
using Tensors = std::vector<Tensor>;

// What one forward call saved for its backward, and the contexts of the
// children it called. Clear() drops everything (the activations' memory).
class Context {
 public:
  // Stores this call's saved state (any copyable or movable value).
  template <typename T>
  T& Save(T value) {
    saved_ = std::move(value);
    return std::any_cast<T&>(saved_);
  }
  template <typename T>
  T& Saved() {
    return *CheckedCast<T>();
  }
  bool has_saved() const { return saved_.has_value(); }
  // The context of the i-th child call (created on first use).
  Context& Child(size_t i);
  void Clear();

 private:
  template <typename T>
  T* CheckedCast() {
    T* p = std::any_cast<T>(&saved_);
    if (p == nullptr) ThrowMissingSaved();
    return p;
  }
  [[noreturn]] void ThrowMissingSaved() const;

  std::any saved_;
  std::deque<Context> children_;
};

class Module;

// A module that draws random numbers (dropout) from its own generator. Activation
// checkpointing records and replays these generators so a recompute draws the
// same masks; SeedRandomSources (checkpoint.h) gives each a distinct stream.
class RandomSource {
 public:
  virtual ~RandomSource() = default;
  virtual tensor::Generator& generator() = 0;
};

// Callbacks around a module's forward and backward (installed by wrappers such
// as FSDP units and activation checkpointing).
class ModuleHooks {
 public:
  virtual ~ModuleHooks() = default;
  virtual void PreForward(Module& module) {}
  virtual void PostForward(Module& module) {}
  virtual void PreBackward(Module& module) {}
  virtual void PostBackward(Module& module) {}
};

class Module {
 public:
  explicit Module(std::string class_name) : class_name_(std::move(class_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The class name wrap policies match on ("Block", "T5Block", "Linear", ...).
  const std::string& class_name() const { return class_name_; }

  // ---- Calling a module (runs hooks, sets memory categories) ----
  Tensors Run(const Tensors& inputs, Context& ctx);
  // grad_outputs match Forward's outputs; returns gradients of the inputs
  // (an undefined Tensor for inputs that need none, e.g. token ids).
  Tensors RunBackward(const Tensors& grad_outputs, Context& ctx);
  // Single-input, single-output shorthand.
  Tensor Run(const Tensor& x, Context& ctx) { return Run(Tensors{x}, ctx).at(0); }
  Tensor RunBackward(const Tensor& grad_y, Context& ctx) {
    return RunBackward(Tensors{grad_y}, ctx).at(0);
  }

  // ---- Structure ----
  // Parameters, buffers and children with dotted names relative to this module,
  // in registration order, depth first ("h.0.attn.c_attn.weight").
  std::vector<std::pair<std::string, Parameter*>> NamedParameters();
  std::vector<std::pair<std::string, Tensor*>> NamedBuffers();
  // Direct children.
  std::vector<std::pair<std::string, Module*>> NamedChildren();
  // This module ("") and all descendants, pre-order.
  std::vector<std::pair<std::string, Module*>> NamedModules();
  // Parameters of this module only (not of children).
  std::vector<std::pair<std::string, Parameter*>> LocalParameters();
  int64_t NumParameters();

  // ---- State ----
  void Train(bool training);
  bool is_training() const { return training_; }
  // Zeroes every gradient in place, keeping the buffers (set_to_none=false,
  // the default here: no re-allocation next step), or drops them (undefined).
  void ZeroGrad(bool set_to_none = false);
  // Allocates and initializes every parameter that has no value yet (fp32, on
  // `device`), deterministically from `seed` and the parameter names, and
  // moves the parameters that have one (e.g. loaded weights) and the buffers
  // to `device`.
  void Materialize(uint64_t seed, tensor::Device device = tensor::Device::Cpu());

  void set_hooks(ModuleHooks* hooks) { hooks_ = hooks; }
  ModuleHooks* hooks() const { return hooks_; }

 protected:
  virtual Tensors Forward(const Tensors& inputs, Context& ctx) = 0;
  virtual Tensors Backward(const Tensors& grad_outputs, Context& ctx) = 0;

  // Run's frame around `forward` (the memory category and hooks Run runs) and
  // RunBackward's around `backward` (its memory category and hooks, and ctx
  // cleared after): for a module's own extra entry points (Linear::RunGelu,
  // Linear::RunBackwardThroughGelu).
  Tensors RunFrame(absl::FunctionRef<Tensors()> forward);
  Tensors RunBackwardFrame(Context& ctx, absl::FunctionRef<Tensors()> backward);

  // Registration, from constructors. Parameters are created unmaterialized
  // (shape and init recipe only); Materialize() or FSDP gives them values.
  Parameter* RegisterParameter(std::string name, tensor::Shape shape, InitSpec init,
                               bool weight_decay = true);
  Tensor* RegisterBuffer(std::string name, Tensor value);
  template <typename M>
  M* RegisterModule(std::string name, std::unique_ptr<M> module) {
    M* raw = module.get();
    children_.emplace_back(std::move(name), std::move(module));
    return raw;
  }

 private:
  void CollectParameters(const std::string& prefix,
                         std::vector<std::pair<std::string, Parameter*>>* out);
  void CollectBuffers(const std::string& prefix, std::vector<std::pair<std::string, Tensor*>>* out);
  void CollectModules(const std::string& prefix, std::vector<std::pair<std::string, Module*>>* out);

  std::string class_name_;
  bool training_ = true;
  ModuleHooks* hooks_ = nullptr;  // not owned
  std::deque<std::pair<std::string, Parameter>> parameters_;
  std::deque<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> children_;
};

}  // namespace nn

#endif  // NN_MODULE_H_
