// nn::Module traversal, hooks and materialization.
#include "nn/module.h"

#include "absl/strings/str_cat.h"
#include "tensor/error.h"
#include "tensor/memory_ledger.h"
#include "tensor/ops/init.h"

namespace nn {
namespace {

std::string Join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : absl::StrCat(prefix, ".", name);
}

}  // namespace

Context& Context::Child(size_t i) {
  while (children_.size() <= i) children_.emplace_back();
  return children_[i];
}

void Context::Clear() {
  saved_.reset();
  children_.clear();
}

void Context::ThrowMissingSaved() const {
  tensor::ThrowOpError("backward", "the context holds no saved state of the expected type; ",
                       "was Forward run with this context (and not cleared) before Backward?");
}

Tensors Module::Run(const Tensors& inputs, Context& ctx) {
  return RunFrame([&] { return Forward(inputs, ctx); });
}

Tensors Module::RunFrame(absl::FunctionRef<Tensors()> forward) {
  tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kActivations);
  if (hooks_) hooks_->PreForward(*this);
  Tensors out = forward();
  if (hooks_) hooks_->PostForward(*this);
  return out;
}

Tensors Module::RunBackward(const Tensors& grad_outputs, Context& ctx) {
  return RunBackwardFrame(ctx, [&] { return Backward(grad_outputs, ctx); });
}

Tensors Module::RunBackwardFrame(Context& ctx, absl::FunctionRef<Tensors()> backward) {
  tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kTemporaries);
  if (hooks_) hooks_->PreBackward(*this);
  Tensors grads = backward();
  ctx.Clear();  // the saved activations are no longer needed
  if (hooks_) hooks_->PostBackward(*this);
  return grads;
}

Parameter* Module::RegisterParameter(std::string name, tensor::Shape shape, InitSpec init,
                                     bool weight_decay) {
  Parameter p;
  p.shape = std::move(shape);
  p.init = init;
  p.weight_decay = weight_decay;
  parameters_.emplace_back(std::move(name), std::move(p));
  return &parameters_.back().second;
}

Tensor* Module::RegisterBuffer(std::string name, Tensor value) {
  buffers_.emplace_back(std::move(name), std::move(value));
  return &buffers_.back().second;
}

void Module::CollectParameters(const std::string& prefix,
                               std::vector<std::pair<std::string, Parameter*>>* out) {
  for (auto& [name, p] : parameters_) out->emplace_back(Join(prefix, name), &p);
  for (auto& [name, child] : children_) child->CollectParameters(Join(prefix, name), out);
}

void Module::CollectBuffers(const std::string& prefix,
                            std::vector<std::pair<std::string, Tensor*>>* out) {
  for (auto& [name, b] : buffers_) out->emplace_back(Join(prefix, name), &b);
  for (auto& [name, child] : children_) child->CollectBuffers(Join(prefix, name), out);
}

void Module::CollectModules(const std::string& prefix,
                            std::vector<std::pair<std::string, Module*>>* out) {
  out->emplace_back(prefix, this);
  for (auto& [name, child] : children_) child->CollectModules(Join(prefix, name), out);
}

std::vector<std::pair<std::string, Parameter*>> Module::NamedParameters() {
  std::vector<std::pair<std::string, Parameter*>> out;
  CollectParameters("", &out);
  return out;
}

std::vector<std::pair<std::string, Parameter*>> Module::LocalParameters() {
  std::vector<std::pair<std::string, Parameter*>> out;
  for (auto& [name, p] : parameters_) out.emplace_back(name, &p);
  return out;
}

std::vector<std::pair<std::string, Tensor*>> Module::NamedBuffers() {
  std::vector<std::pair<std::string, Tensor*>> out;
  CollectBuffers("", &out);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::NamedChildren() {
  std::vector<std::pair<std::string, Module*>> out;
  for (auto& [name, child] : children_) out.emplace_back(name, child.get());
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::NamedModules() {
  std::vector<std::pair<std::string, Module*>> out;
  CollectModules("", &out);
  return out;
}

int64_t Module::NumParameters() {
  int64_t n = 0;
  for (auto& [name, p] : NamedParameters()) n += p->numel();
  return n;
}

void Module::Train(bool training) {
  training_ = training;
  for (auto& [name, child] : children_) child->Train(training);
}

void Module::ZeroGrad(bool set_to_none) {
  for (auto& [name, p] : NamedParameters()) {
    if (set_to_none || !p->grad.defined()) {
      p->DropGrad();
      continue;
    }
    if (p->grad.is_contiguous()) {
      tensor::Zero(p->grad);  // in place; on a GPU a memset queued on its stream
    } else {
      p->grad.CopyFrom(Tensor::Zeros(p->grad.shape(), p->grad.dtype(), p->grad.device()));
    }
    p->grad_unwritten = false;  // zeros now, in fact
  }
}

void Module::Materialize(uint64_t seed, tensor::Device device) {
  tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kParameters);
  for (auto& [name, p] : NamedParameters()) {
    if (p->value.defined()) {
      if (p->value.device() != device) p->value = p->value.To(device);
      continue;
    }
    Tensor cpu = Tensor::Empty(p->shape, tensor::Dtype::kF32);
    InitSlice(p->init, seed, name, 0, cpu);
    p->value = cpu.To(device);
  }
  // Buffers (BatchNorm's running statistics) go with the parameters.
  for (auto& [name, b] : NamedBuffers()) {
    if (b->defined() && b->device() != device) *b = b->To(device);
  }
}

}  // namespace nn
