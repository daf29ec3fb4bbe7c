// Sequential, ModuleList and Residual, and ApplyCheckpointing.
#include "nn/containers.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "nn/checkpoint.h"
#include "tensor/error.h"
#include "tensor/ops/elementwise.h"

namespace nn {
namespace {

std::string ShapeOrUndefined(const Tensor& t) {
  return t.defined() ? t.shape().ToString() : "undefined";
}

}  // namespace

// ---- Container ----

Module* Container::at(size_t i) const {
  OP_CHECK(i < children_.size(), "container", class_name(), " index ", i, " out of range [0, ",
           children_.size(), ")");
  return children_[i];
}

void Container::set_checkpointed(size_t i, bool checkpointed) {
  at(i);  // range check
  checkpointed_[i] = checkpointed;
}

bool Container::checkpointed(size_t i) const {
  at(i);
  return checkpointed_[i];
}

Module* Container::AddChild(std::string name, std::unique_ptr<Module> module) {
  OP_CHECK(module != nullptr, "container", class_name(), " child '", name, "' is null");
  Module* raw = RegisterModule(std::move(name), std::move(module));
  children_.push_back(raw);
  checkpointed_.push_back(false);
  return raw;
}

Tensors Container::RunChild(size_t i, const Tensors& inputs, Context& ctx) {
  return RunMaybeCheckpointed(*at(i), checkpointed_[i], inputs, ctx);
}

Tensors Container::RunChildBackward(size_t i, const Tensors& grad_outputs, Context& ctx) {
  return RunBackwardMaybeCheckpointed(*at(i), checkpointed_[i], grad_outputs, ctx);
}

// ---- Sequential ----

Sequential::Sequential() : Container("Sequential") {}

Sequential::Sequential(std::vector<std::unique_ptr<Module>> modules) : Sequential() {
  for (auto& m : modules) Append(std::move(m));
}

Tensors Sequential::Forward(const Tensors& inputs, Context& ctx) {
  Tensors x = inputs;
  for (size_t i = 0; i < size(); ++i) x = RunChild(i, x, ctx.Child(i));
  return x;
}

Tensors Sequential::Backward(const Tensors& grad_outputs, Context& ctx) {
  Tensors g = grad_outputs;
  for (size_t i = size(); i-- > 0;) g = RunChildBackward(i, g, ctx.Child(i));
  return g;
}

// ---- ModuleList ----

ModuleList::ModuleList() : Container("ModuleList") {}

ModuleList::ModuleList(std::vector<std::unique_ptr<Module>> modules) : ModuleList() {
  for (auto& m : modules) Append(std::move(m));
}

Tensors ModuleList::Forward(const Tensors&, Context&) {
  tensor::ThrowOpError("module_list",
                       "a ModuleList holds children for its parent to call (RunAt); it has no "
                       "forward of its own");
}

Tensors ModuleList::Backward(const Tensors&, Context&) {
  tensor::ThrowOpError("module_list",
                       "a ModuleList holds children for its parent to call (RunBackwardAt); it "
                       "has no backward of its own");
}

// ---- Residual ----

Residual::Residual(std::unique_ptr<Module> fn) : Container("Residual") {
  AddChild("fn", std::move(fn));
}

Tensors Residual::Forward(const Tensors& inputs, Context& ctx) {
  OP_CHECK(!inputs.empty() && inputs[0].defined(), "residual", "needs a defined input x; got ",
           inputs.size(), " inputs");
  const Tensor& x = inputs[0];
  Tensors out = RunChild(0, inputs, ctx.Child(0));
  OP_CHECK(!out.empty() && out[0].defined() && out[0].shape() == x.shape(), "residual", "fn (",
           fn()->class_name(), ") output ", out.empty() ? "none" : ShapeOrUndefined(out[0]),
           " does not match the input ", x.shape().ToString());
  out[0] = tensor::Add(x, out[0].To(x.dtype()));
  ctx.Save(Saved{x.dtype(), x.shape()});
  return out;
}

Tensors Residual::Backward(const Tensors& grad_outputs, Context& ctx) {
  const Saved s = ctx.Saved<Saved>();
  const Tensor gy = grad_outputs.at(0).To(s.x_dtype);  // (x's shape)
  Tensors grads = RunChildBackward(0, grad_outputs, ctx.Child(0));
  Tensor& gx = grads.at(0);
  if (!gx.defined()) {
    gx = gy;
  } else if (gx.dtype() == s.x_dtype && gx.is_contiguous() && !gx.SharesStorageWith(gy)) {
    tensor::AddInPlace(gx, gy);  // gx is fn's fresh gradient: no new buffer
  } else {
    gx = tensor::Add(gy, gx.To(s.x_dtype));
  }
  return grads;
}

// ---- ApplyCheckpointing ----

int ApplyCheckpointing(Module& root,
                       const std::function<bool(const std::string&, Module&)>& predicate) {
  OP_CHECK(!predicate("", root), "apply_checkpointing", "the root module (", root.class_name(),
           ") matches; it has no parent container to checkpoint it: call CheckpointedRun "
           "where it is run");
  std::vector<std::pair<Container*, size_t>> flags;
  for (auto& [name, m] : root.NamedModules()) {
    auto* container = dynamic_cast<Container*>(m);
    const auto children = m->NamedChildren();
    for (size_t i = 0; i < children.size(); ++i) {
      const auto& [child_name, child] = children[i];
      const std::string full = name.empty() ? child_name : absl::StrCat(name, ".", child_name);
      if (!predicate(full, *child)) continue;
      OP_CHECK(container != nullptr, "apply_checkpointing", "module '", full, "' (",
               child->class_name(), ") matches but its parent '", name, "' (", m->class_name(),
               ") is not a Container; call CheckpointedRun for it in the parent's Forward");
      size_t index = 0;
      while (container->at(index) != child) ++index;  // at() throws past the end
      flags.emplace_back(container, index);
    }
  }
  for (auto& [container, index] : flags) container->set_checkpointed(index, true);
  return static_cast<int>(flags.size());
}

}  // namespace nn
