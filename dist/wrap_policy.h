// FSDP wrap policies: which modules of a model become FSDP units.
//
// Units are the modules a policy selects plus the root, which always forms a
// unit of its own holding every parameter not inside a selected module. Each
// parameter belongs to its nearest enclosing unit module.
//
//   transformer({"Block", "T5Block"}) and predicate(fn): walk the modules
//     pre-order; a match becomes a unit and its subtree is not searched further
//     (the outermost match wins).
//   size_based(min_params): bottom-up like PyTorch's size_based_auto_wrap_policy:
//     a (non-root) module becomes a unit when the parameters of its subtree not
//     already in a unit below it number at least min_params (units may nest).
//     A ModuleList (never called itself, so its hooks would never run) is
//     never wrapped.
//   none(): the root is the only unit.
//
// FullyShard applies policy.ForMixedPrecision(its mixed-precision policy):
// under low-precision compute or reduction, modules of the classes kept fp32
// (BatchNorm) become units of their own, nested in whichever unit holds them.
#ifndef DIST_WRAP_POLICY_H_
#define DIST_WRAP_POLICY_H_

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "nn/module.h"
#include "precision/policy.h"

namespace dist {

class WrapPolicy {
 public:
  // fn(name relative to the root, module) -> wrap it.
  using Predicate = std::function<bool(const std::string& name, nn::Module& module)>;

  static WrapPolicy None();
  static WrapPolicy Transformer(std::set<std::string> block_class_names);
  static WrapPolicy SizeBased(int64_t min_params);
  static WrapPolicy FromPredicate(Predicate predicate);
  // `base`, and every module that holds parameters, has no children, whose
  // parameters are all frozen (requires_grad false) and that `base` leaves in
  // the root unit becomes a unit of its own: minGPT's frozen embeddings then
  // leave the root unit, which keeps only trainable parameters, so no unit
  // holds a gradient or optimizer state for them (the mixed units' cost,
  // flat_param.h). Frozen leaves inside `base`'s units stay there. Modules
  // holding a parameter of `keep` stay where `base` puts them (tied weights
  // that must stay in the root unit). Any `base`: None, predicate, size-based.
  static WrapPolicy FrozenLeavesApart(WrapPolicy base,
                                      std::set<const nn::Parameter*> keep = {});
  // The same with `keep` the parameters of `root` named in `keep_names`
  // (names relative to `root`; names it lacks select nothing).
  static WrapPolicy FrozenLeavesApart(WrapPolicy base, nn::Module& root,
                                      const std::vector<std::string>& keep_names);

  // The policy FullyShard applies under `mp`: this one, plus, when mp
  // computes or reduces in a low precision, every outermost module of one of
  // mp.fp32_module_classes that holds a parameter (none when the root is of
  // one; for a ModuleList, never called, each of its children holding one)
  // as a unit of its own, nested in the unit that would hold it, as PyTorch
  // FSDP wraps its _module_classes_to_ignore in fp32 units under an
  // auto-wrap policy (here under None() too). Such a unit gathers and
  // reduces in fp32 while the rest of the enclosing unit computes and
  // reduces in the low precision; each costs collectives of its own and
  // takes a slot of the prefetch window. SizeBased counts such modules as
  // units already (their parameters do not make a parent reach min_params),
  // and FrozenLeavesApart leaves the frozen leaves inside them there. Under
  // fp32: this policy without such units (whatever an earlier call added).
  WrapPolicy ForMixedPrecision(const precision::MixedPrecisionPolicy& mp) const;

  // Transformer(names): InvalidArgument unless some module under `root` is of
  // one of the classes, naming them and the classes `root` has (a misspelt
  // class would leave the whole model in the root unit, gathered at once).
  // OK for the other policies. FullyShard checks it.
  absl::Status CheckMatches(nn::Module& root) const;

  // The unit modules (name relative to the root, module) in pre-order; the
  // root ("") is always first.
  std::vector<std::pair<std::string, nn::Module*>> SelectUnits(nn::Module& root) const;

 private:
  // Adds to `units` (modules of the units so far) the leaves apart_ takes out
  // of the root unit.
  void AddLeavesApart(nn::Module& root, std::set<nn::Module*>* units) const;

  enum class Kind { kNone, kOutermost, kSizeBased };
  Kind kind_ = Kind::kNone;
  Predicate predicate_;
  int64_t min_params_ = 0;
  std::set<std::string> block_class_names_;  // Transformer's
  // FrozenLeavesApart: leaves the base leaves in the root unit that become units.
  Predicate apart_;
  // ForMixedPrecision: classes whose outermost modules become units.
  std::vector<std::string> fp32_classes_;
};

// One unit and the parameters it holds (full names relative to the root, in
// registration order).
struct UnitPlan {
  std::string name;  // "" for the root
  nn::Module* module = nullptr;
  std::vector<std::pair<std::string, nn::Parameter*>> params;
};

// Selects the units and assigns every parameter of `root` to its nearest
// enclosing unit. The root's plan is first; units are in pre-order.
std::vector<UnitPlan> PlanUnits(nn::Module& root, const WrapPolicy& policy);

}  // namespace dist

#endif  // DIST_WRAP_POLICY_H_
