// Containers: Sequential (runs its children in order), ModuleList (holds
// children for its parent to call) and Residual (y = x + f(x)). Children are
// named "0", "1", ... (Residual: "fn"), so parameter names come out as
// PyTorch's ("h.0.attn.c_attn.weight").
//
// Every container can run any child with activation checkpointing
// (nn/checkpoint.h): set_checkpointed(i, true) per child, or
// ApplyCheckpointing(root, predicate) over a whole model. The child stays
// registered under its own name, so parameter names do not change.
#ifndef NN_CONTAINERS_H_
#define NN_CONTAINERS_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"

namespace nn {

// Base of the containers: an indexed list of children with a checkpoint flag each.
class Container : public Module {
 public:
  size_t size() const { return children_.size(); }
  Module* at(size_t i) const;
  // Run child i with activation checkpointing (forward keeps only its inputs,
  // backward recomputes).
  void set_checkpointed(size_t i, bool checkpointed);
  bool checkpointed(size_t i) const;

 protected:
  explicit Container(std::string class_name) : Module(std::move(class_name)) {}
  Module* AddChild(std::string name, std::unique_ptr<Module> module);
  // child i's Run / RunBackward, checkpointed when flagged.
  Tensors RunChild(size_t i, const Tensors& inputs, Context& ctx);
  Tensors RunChildBackward(size_t i, const Tensors& grad_outputs, Context& ctx);

 private:
  std::vector<Module*> children_;  // owned by Module, in registration order
  std::vector<bool> checkpointed_;
};

// Runs children in order, each one's outputs being the next one's inputs;
// backward in reverse. Empty: the identity.
class Sequential : public Container {
 public:
  Sequential();
  explicit Sequential(std::vector<std::unique_ptr<Module>> modules);
  // Registers `module` as child "<size()>" and returns it.
  template <typename M>
  M* Append(std::unique_ptr<M> module) {
    M* raw = module.get();
    AddChild(std::to_string(size()), std::move(module));
    return raw;
  }

 protected:
  Tensors Forward(const Tensors& inputs, Context& ctx) override;
  Tensors Backward(const Tensors& grad_outputs, Context& ctx) override;
};

// Holds children ("0", "1", ...) for a parent that calls them itself, e.g.
// GPT's transformer.h. It has no forward of its own (Run throws); the parent
// calls RunAt / RunBackwardAt, which honor the checkpoint flags (or at(i)->Run,
// which ignores them).
class ModuleList : public Container {
 public:
  ModuleList();
  explicit ModuleList(std::vector<std::unique_ptr<Module>> modules);
  template <typename M>
  M* Append(std::unique_ptr<M> module) {
    M* raw = module.get();
    AddChild(std::to_string(size()), std::move(module));
    return raw;
  }
  // Child i's Run / RunBackward (checkpointed when flagged); pass the same
  // context to both, e.g. ctx.Child(i).
  Tensors RunAt(size_t i, const Tensors& inputs, Context& ctx) { return RunChild(i, inputs, ctx); }
  Tensor RunAt(size_t i, const Tensor& x, Context& ctx) { return RunChild(i, {x}, ctx).at(0); }
  Tensors RunBackwardAt(size_t i, const Tensors& grad_outputs, Context& ctx) {
    return RunChildBackward(i, grad_outputs, ctx);
  }
  Tensor RunBackwardAt(size_t i, const Tensor& grad_y, Context& ctx) {
    return RunChildBackward(i, {grad_y}, ctx).at(0);
  }

 protected:
  Tensors Forward(const Tensors& inputs, Context& ctx) override;
  Tensors Backward(const Tensors& grad_outputs, Context& ctx) override;
};

// y = x + f(x) with f registered as child "fn". f receives all the inputs;
// inputs[0] is added to f's first output, in inputs[0]'s dtype (f's output is
// cast to it), and f's other outputs pass through. Backward: the gradient of
// y flows both into f and straight to x, and the two add up.
class Residual : public Container {
 public:
  explicit Residual(std::unique_ptr<Module> fn);
  Module* fn() const { return at(0); }

 protected:
  Tensors Forward(const Tensors& inputs, Context& ctx) override;
  Tensors Backward(const Tensors& grad_outputs, Context& ctx) override;

 private:
  struct Saved {
    tensor::Dtype x_dtype;
    tensor::Shape x_shape;
  };
};

// Flags every child of a container, anywhere under `root`, for which
// predicate(dotted name, module) is true, to run with activation
// checkpointing; returns how many were flagged. A matching module whose parent
// is not a Container (or the root itself) cannot be flagged: that throws
// OpError "[apply_checkpointing] ..." naming it (its parent's Forward can call
// CheckpointedRun itself). Names are unchanged.
int ApplyCheckpointing(Module& root,
                       const std::function<bool(const std::string&, Module&)>& predicate);

}  // namespace nn

#endif  // NN_CONTAINERS_H_
