// FSDP wrap policies (wrap_policy.h): which modules become units.
#include "dist/wrap_policy.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tensor/dtype.h"

namespace dist {
namespace {

std::string Join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

void SelectOutermost(nn::Module& m, const std::string& name, const WrapPolicy::Predicate& pred,
               std::vector<std::pair<std::string, nn::Module*>>* out) {
  for (auto& [child_name, child] : m.NamedChildren()) {
    const std::string full = Join(name, child_name);
    if (pred(full, *child)) {
      out->emplace_back(full, child);
    } else {
      SelectOutermost(*child, full, pred, out);
    }
  }
}

// Returns the number of parameters of m's subtree not in a unit at or below m.
// The `kept` units (KeptUnits) count as units already: their parameters do
// not count towards their parents' (as PyTorch wraps them first).
int64_t SelectBySize(nn::Module& m, const std::string& name, int64_t min_params, bool is_root,
                     const std::set<nn::Module*>& kept,
                     std::vector<std::pair<std::string, nn::Module*>>* out) {
  int64_t remaining = 0;
  for (auto& [pname, p] : m.LocalParameters()) remaining += p->numel();
  std::vector<std::pair<std::string, nn::Module*>> below;
  for (auto& [child_name, child] : m.NamedChildren()) {
    remaining += SelectBySize(*child, Join(name, child_name), min_params, false, kept, &below);
  }
  if (kept.count(&m) > 0) {  // a unit anyway (added by InPreOrder)
    out->insert(out->end(), below.begin(), below.end());
    return 0;
  }
  // A ModuleList is never called (its parent calls the children through
  // RunAt / RunBackwardAt), so its hooks would never fire: never a unit.
  if (!is_root && m.class_name() != "ModuleList" && remaining >= min_params && remaining > 0) {
    out->emplace_back(name, &m);  // pre-order: the parent before its nested units
    remaining = 0;
  }
  out->insert(out->end(), below.begin(), below.end());
  return remaining;
}

// The outermost modules of `classes` that hold a parameter (none under a
// root of one of them: everything there is kept already). A ModuleList of
// `classes` is never called: its children (all kept) take its place.
std::set<nn::Module*> KeptUnits(nn::Module& root, const std::vector<std::string>& classes) {
  std::set<nn::Module*> kept;
  if (classes.empty()) return kept;
  const auto of_class = [&](nn::Module& m) {
    return std::find(classes.begin(), classes.end(), m.class_name()) != classes.end();
  };
  std::function<void(nn::Module&, bool)> walk = [&](nn::Module& m, bool in_kept_list) {
    for (auto& [child_name, child] : m.NamedChildren()) {
      if ((in_kept_list || of_class(*child)) && !child->NamedParameters().empty()) {
        if (child->class_name() != "ModuleList") {
          kept.insert(child);  // the outermost: nothing below it is searched
        } else {
          walk(*child, /*in_kept_list=*/true);
        }
      } else {
        walk(*child, /*in_kept_list=*/false);
      }
    }
  };
  if (!of_class(root)) walk(root, /*in_kept_list=*/false);
  return kept;
}

// The modules of `units` (and the root) in pre-order, named.
std::vector<std::pair<std::string, nn::Module*>> InPreOrder(nn::Module& root,
                                                           const std::set<nn::Module*>& units) {
  std::vector<std::pair<std::string, nn::Module*>> ordered = {{"", &root}};
  std::function<void(nn::Module&, const std::string&)> walk = [&](nn::Module& m,
                                                                  const std::string& name) {
    for (auto& [child_name, child] : m.NamedChildren()) {
      const std::string full = Join(name, child_name);
      if (units.count(child) > 0) ordered.emplace_back(full, child);
      walk(*child, full);
    }
  };
  walk(root, "");
  return ordered;
}

void Assign(nn::Module& m, const std::string& name, int unit,
            const std::map<nn::Module*, int>& index, std::vector<UnitPlan>* plans) {
  auto it = index.find(&m);
  if (it != index.end()) unit = it->second;
  for (auto& [pname, p] : m.LocalParameters()) {
    (*plans)[unit].params.emplace_back(Join(name, pname), p);
  }
  for (auto& [child_name, child] : m.NamedChildren()) {
    Assign(*child, Join(name, child_name), unit, index, plans);
  }
}

}  // namespace

WrapPolicy WrapPolicy::None() { return WrapPolicy(); }

WrapPolicy WrapPolicy::Transformer(std::set<std::string> block_class_names) {
  WrapPolicy p = FromPredicate([names = block_class_names](const std::string&, nn::Module& m) {
    return names.count(m.class_name()) > 0;
  });
  p.block_class_names_ = std::move(block_class_names);
  return p;
}

absl::Status WrapPolicy::CheckMatches(nn::Module& root) const {
  if (block_class_names_.empty()) return absl::OkStatus();
  std::set<std::string> classes;
  for (const auto& [name, m] : root.NamedModules()) {
    if (name.empty()) continue;  // the root is a unit whatever its class
    if (block_class_names_.count(m->class_name()) > 0) return absl::OkStatus();
    classes.insert(m->class_name());
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "the transformer wrap policy's block classes {", absl::StrJoin(block_class_names_, ", "),
      "} match no module of the model (its classes: ", absl::StrJoin(classes, ", "),
      "); as given, the whole model would be one unit"));
}

WrapPolicy WrapPolicy::SizeBased(int64_t min_params) {
  WrapPolicy p;
  p.kind_ = Kind::kSizeBased;
  p.min_params_ = min_params;
  return p;
}

WrapPolicy WrapPolicy::FromPredicate(Predicate predicate) {
  WrapPolicy p;
  p.kind_ = Kind::kOutermost;
  p.predicate_ = std::move(predicate);
  return p;
}

WrapPolicy WrapPolicy::FrozenLeavesApart(WrapPolicy base, std::set<const nn::Parameter*> keep) {
  base.apart_ = [previous = std::move(base.apart_), keep = std::move(keep)](
                    const std::string& name, nn::Module& m) {
    if (previous && previous(name, m)) return true;
    const auto params = m.LocalParameters();
    if (params.empty() || !m.NamedChildren().empty()) return false;
    for (const auto& [pname, p] : params) {
      if (p->requires_grad || keep.count(p) > 0) return false;
    }
    return true;
  };
  return base;
}

WrapPolicy WrapPolicy::ForMixedPrecision(const precision::MixedPrecisionPolicy& mp) const {
  WrapPolicy p = *this;
  const bool low = mp.param_dtype != tensor::Dtype::kF32 || mp.reduce_dtype != tensor::Dtype::kF32;
  p.fp32_classes_ = low ? mp.fp32_module_classes : std::vector<std::string>{};
  return p;
}

WrapPolicy WrapPolicy::FrozenLeavesApart(WrapPolicy base, nn::Module& root,
                                         const std::vector<std::string>& keep_names) {
  const std::set<std::string> names(keep_names.begin(), keep_names.end());
  std::set<const nn::Parameter*> keep;
  for (const auto& [name, p] : root.NamedParameters()) {
    if (names.count(name) > 0) keep.insert(p);
  }
  return FrozenLeavesApart(std::move(base), std::move(keep));
}

std::vector<std::pair<std::string, nn::Module*>> WrapPolicy::SelectUnits(nn::Module& root) const {
  const std::set<nn::Module*> kept = KeptUnits(root, fp32_classes_);
  std::vector<std::pair<std::string, nn::Module*>> out = {{"", &root}};
  switch (kind_) {
    case Kind::kNone:
      break;
    case Kind::kOutermost:
      SelectOutermost(root, "", predicate_, &out);
      break;
    case Kind::kSizeBased:
      SelectBySize(root, "", min_params_, /*is_root=*/true, kept, &out);
      break;
  }
  // The kept modules nest in whichever unit holds them; units inside them stay.
  std::set<nn::Module*> units(kept);
  for (const auto& [name, m] : out) units.insert(m);
  // Frozen leaves inside a kept module stay there, as inside the base's units.
  if (apart_) AddLeavesApart(root, &units);
  return InPreOrder(root, units);
}

void WrapPolicy::AddLeavesApart(nn::Module& root, std::set<nn::Module*>* units) const {
  std::function<void(nn::Module&, const std::string&, bool)> walk =
      [&](nn::Module& m, const std::string& name, bool in_unit) {
        for (auto& [child_name, child] : m.NamedChildren()) {
          const std::string full = Join(name, child_name);
          if (units->count(child) > 0) {
            walk(*child, full, /*in_unit=*/true);
          } else if (!in_unit && apart_(full, *child)) {
            units->insert(child);  // a leaf: nothing below it
          } else {
            walk(*child, full, in_unit);
          }
        }
      };
  walk(root, "", /*in_unit=*/false);
}

std::vector<UnitPlan> PlanUnits(nn::Module& root, const WrapPolicy& policy) {
  std::vector<UnitPlan> plans;
  std::map<nn::Module*, int> index;
  for (auto& [name, m] : policy.SelectUnits(root)) {
    index[m] = static_cast<int>(plans.size());
    UnitPlan plan;
    plan.name = name;
    plan.module = m;
    plans.push_back(std::move(plan));
  }
  Assign(root, "", 0, index, &plans);
  return plans;
}

}  // namespace dist
