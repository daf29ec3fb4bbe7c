// Optimizer state management shared by SGD and AdamW: lazy creation, the step
// loop, save and load.
#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <unordered_set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tensor/cuda_backend.h"
#include "tensor/memory_ledger.h"
#include "tensor/thread_pool.h"

namespace optim {

using tensor::Tensor;

namespace {

// Elements per ParallelFor chunk of the update loops (64 KiB of fp32 per tensor).
constexpr int64_t kGrain = 1 << 14;

}  // namespace

void RaiseDeferredGpuChecks(const std::vector<ParamRef>& params) {
  std::set<int> gpus;
  for (const ParamRef& ref : params) {
    if (ref.param.device().is_cuda()) gpus.insert(ref.param.device().index);
  }
  for (int gpu : gpus) tensor::cuda::RaiseDeferredChecks(gpu, /*wait=*/true);
}

void Optimizer::Step(const std::vector<ParamRef>& params) {
  CheckParamRefs(name(), params);
  // No step while a GPU check of this step's inputs (an embedding's ids) is
  // unread: it is waited for and thrown before anything changes. A wait only
  // when one is pending (a training step reads its loss first, which reports
  // them).
  RaiseDeferredGpuChecks(params);
  for (const ParamRef& ref : params) {
    auto it = state_.find(ref.name);
    if (it == state_.end() || it->second.buffers.empty()) continue;
    const tensor::Shape& kept = it->second.buffers[0].shape();
    OP_CHECK(kept == ref.param.shape(), name(), "parameter '", ref.name, "' has shape ",
             ref.param.shape().ToString(), " but its optimizer state has shape ", kept.ToString());
  }
  const size_t num_buffers = BufferNames().size();
  std::vector<Updating> updating;
  updating.reserve(params.size());
  for (const ParamRef& ref : params) {
    auto it = state_.find(ref.name);
    if (it == state_.end()) {
      // Allocate first, so a failed allocation leaves no half-made state behind.
      ParamState fresh;
      {
        tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kOptimizerState);
        for (size_t k = 0; k < num_buffers; ++k) {
          fresh.buffers.push_back(
              Tensor::Zeros(ref.param.shape(), tensor::Dtype::kF32, ref.param.device()));
        }
      }
      it = state_.emplace(ref.name, std::move(fresh)).first;
      order_.push_back(ref.name);
    }
    ParamState& state = it->second;
    // State follows its parameter: state loaded from a checkpoint (host
    // tensors) for a parameter on a GPU moves there once.
    for (Tensor& b : state.buffers) {
      if (b.device() != ref.param.device()) {
        tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kOptimizerState);
        b = b.To(ref.param.device());
      }
    }
    updating.push_back({&ref, &state});
  }
  // Counted once every parameter's state is made and on its device: an
  // allocation that failed above (out of memory) left every step count as
  // it was, and the parameters unchanged.
  for (Updating& u : updating) ++u.state->step;
  UpdateAll(updating);
  // The low-precision copies the update did not write: cast (batched per
  // device and dtype) from the updated params.
  std::vector<Tensor> updated, copies;
  for (const ParamRef& ref : params) {
    if (!ref.low_precision_copy.defined() || WritesLowPrecisionCopy(ref)) continue;
    updated.push_back(ref.param);
    copies.push_back(ref.low_precision_copy);
  }
  tensor::CastAllInto(updated, copies);
}

void Optimizer::UpdateAll(const std::vector<Updating>& params) {
  for (const Updating& u : params) Update(*u.ref, *u.state);
}

void Optimizer::set_lr(double lr) {
  OP_CHECK(std::isfinite(lr) && lr >= 0, name(), "learning rate must be finite and >= 0, got ", lr);
  lr_ = lr;
}

int64_t Optimizer::StateBytes() const {
  int64_t bytes = 0;
  for (const auto& [n, state] : state_) {
    for (const Tensor& b : state.buffers) bytes += b.nbytes();
  }
  return bytes;
}

int64_t Optimizer::StepCount(const std::string& param_name) const {
  auto it = state_.find(param_name);
  return it == state_.end() ? 0 : it->second.step;
}

void Optimizer::ClearState() {
  state_.clear();
  order_.clear();
}

NamedTensors Optimizer::StateTensors() const {
  const std::vector<std::string> keys = BufferNames();
  NamedTensors out;
  for (const std::string& param : order_) {
    const ParamState& state = state_.at(param);
    const int64_t step = state.step;
    out.emplace_back(absl::StrCat(param, ".step"),
                     Tensor::FromData<int64_t>(absl::MakeConstSpan(&step, 1), {1}));
    for (size_t k = 0; k < keys.size(); ++k) {
      out.emplace_back(absl::StrCat(param, ".", keys[k]), state.buffers[k]);
    }
  }
  return out;
}

absl::Status Optimizer::LoadStateTensors(const NamedTensors& tensors) {
  return Load(tensors, nullptr);
}

absl::Status Optimizer::LoadStateTensors(const NamedTensors& tensors,
                                         const std::vector<ParamRef>& params) {
  return Load(tensors, &params);
}

absl::Status Optimizer::AdoptStateTensors(NamedTensors tensors) {
  return Load(tensors, nullptr, /*adopt=*/true);
}

absl::Status Optimizer::CheckStateTensors(const NamedTensors& tensors) {
  return Load(tensors, nullptr, /*adopt=*/false, /*check_only=*/true);
}

absl::Status Optimizer::Load(const NamedTensors& tensors, const std::vector<ParamRef>* params,
                             bool adopt, bool check_only) {
  const std::vector<std::string> keys = BufferNames();
  auto error = [&](auto&&... pieces) {
    return absl::InvalidArgumentError(absl::StrCat("[", name(), "] load state: ", pieces...));
  };

  // Group the entries by parameter: "<param>.step" and "<param>.<key>".
  struct Group {
    const Tensor* step = nullptr;
    std::vector<const Tensor*> buffers;
  };
  std::vector<std::string> order;
  std::unordered_map<std::string, Group> groups;
  for (const auto& [entry, t] : tensors) {
    std::string param;
    int key = -2;  // -1: step; k >= 0: keys[k]
    if (absl::EndsWith(entry, ".step") && entry.size() > 5) {
      param = entry.substr(0, entry.size() - 5);
      key = -1;
    }
    for (size_t k = 0; k < keys.size() && key == -2; ++k) {
      const std::string suffix = absl::StrCat(".", keys[k]);
      if (absl::EndsWith(entry, suffix) && entry.size() > suffix.size()) {
        param = entry.substr(0, entry.size() - suffix.size());
        key = static_cast<int>(k);
      }
    }
    if (key == -2) {
      return error("unexpected entry '", entry, "': expected <param>.step",
                   keys.empty() ? "" : " or <param>.{", absl::StrJoin(keys, ","),
                   keys.empty() ? "" : "}");
    }
    if (!t.defined()) return error("entry '", entry, "' is an undefined tensor");
    auto [it, inserted] = groups.try_emplace(param);
    Group& g = it->second;
    if (inserted) {
      order.push_back(param);
      g.buffers.assign(keys.size(), nullptr);
    }
    const Tensor*& slot = key == -1 ? g.step : g.buffers[key];
    if (slot != nullptr) return error("entry '", entry, "' is given twice");
    slot = &t;
  }

  // What shape each parameter's buffers must have, where known.
  std::unordered_map<std::string, tensor::Shape> expected;
  // Where each parameter's buffers live: its device (CPU without `params`).
  std::unordered_map<std::string, tensor::Device> device_of;
  if (params != nullptr) {
    for (const ParamRef& ref : *params) {
      if (!ref.param.defined()) return error("parameter '", ref.name, "' is undefined");
      expected[ref.name] = ref.param.shape();
      device_of.emplace(ref.name, ref.param.device());
      if (groups.count(ref.name) == 0) {
        return error("missing state for parameter '", ref.name, "' (no '", ref.name,
                     ".step' entry)");
      }
    }
    for (const std::string& param : order) {
      if (expected.count(param) == 0) {
        return error("unexpected state for '", param, "': not among the parameters given");
      }
    }
  } else {
    for (const std::string& param : order_) {
      if (groups.count(param) == 0) {
        return error("missing state for parameter '", param, "' (it has state now; no '", param,
                     ".step' entry)");
      }
      const ParamState& state = state_.at(param);
      if (!state.buffers.empty()) expected[param] = state.buffers[0].shape();
    }
  }

  // Validate each parameter's entries.
  std::vector<int64_t> steps;
  for (const std::string& param : order) {
    const Group& g = groups.at(param);
    if (g.step == nullptr) return error("missing entry '", param, ".step'");
    const Tensor& st = *g.step;
    if (st.numel() != 1) {
      return error("entry '", param, ".step' has shape ", st.shape().ToString(),
                   ", expected one element");
    }
    const double step = st.Item();
    if (!(step >= 0) || step != std::floor(step) || step > 9.0e15) {
      return error("entry '", param, ".step' is ", step, ", expected an integer >= 0");
    }
    steps.push_back(static_cast<int64_t>(step));
    const tensor::Shape* shape = nullptr;
    std::string shape_from;
    auto want = expected.find(param);
    if (want != expected.end()) {
      shape = &want->second;
      shape_from = params != nullptr ? "the parameter" : "the current state";
    }
    for (size_t k = 0; k < keys.size(); ++k) {
      const std::string entry = absl::StrCat(param, ".", keys[k]);
      if (g.buffers[k] == nullptr) return error("missing entry '", entry, "'");
      const Tensor& b = *g.buffers[k];
      if (b.dtype() != tensor::Dtype::kF32 || !b.device().is_cpu()) {
        return error("entry '", entry, "' is ", tensor::DtypeName(b.dtype()), " on ",
                     b.device().ToString(), ", expected f32 on cpu");
      }
      if (shape == nullptr) {
        shape = &b.shape();
        shape_from = absl::StrCat("'", param, ".", keys[k], "'");
      } else if (b.shape() != *shape) {
        return error("shape mismatch: entry '", entry, "' has shape ", b.shape().ToString(),
                     " but ", shape_from, " has shape ", shape->ToString());
      }
    }
  }

  if (check_only) return absl::OkStatus();

  // Allocate what cannot be reused, then copy: nothing can fail after this.
  std::unordered_map<std::string, ParamState> next;
  {
    tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kOptimizerState);
    for (size_t i = 0; i < order.size(); ++i) {
      const std::string& param = order[i];
      const Group& g = groups.at(param);
      ParamState state;
      state.step = steps[i];
      auto old = state_.find(param);
      for (size_t k = 0; k < keys.size(); ++k) {
        const tensor::Shape& shape = g.buffers[k]->shape();
        auto on = device_of.find(param);
        const tensor::Device device = on != device_of.end() ? on->second : tensor::Device::Cpu();
        const Tensor& src = *g.buffers[k];
        if (old != state_.end() && old->second.buffers.size() == keys.size() &&
            old->second.buffers[k].shape() == shape &&
            old->second.buffers[k].device() == device) {
          state.buffers.push_back(old->second.buffers[k]);
        } else if (adopt && src.device() == device && src.is_contiguous()) {
          state.buffers.push_back(src);  // f32 (checked above): the copy below is skipped
        } else {
          state.buffers.push_back(Tensor::Empty(shape, tensor::Dtype::kF32, device));
        }
      }
      next.emplace(param, std::move(state));
    }
  }
  for (const std::string& param : order) {
    const Group& g = groups.at(param);
    ParamState& state = next.at(param);
    for (size_t k = 0; k < keys.size(); ++k) {
      const Tensor& src = *g.buffers[k];
      Tensor& dst = state.buffers[k];
      if (src.SharesStorageWith(dst) && src.offset() == dst.offset() &&
          src.strides() == dst.strides()) {
        continue;  // loading a buffer onto itself
      }
      dst.CopyFrom(src);
    }
  }
  state_ = std::move(next);
  order_ = std::move(order);
  return absl::OkStatus();
}

namespace {

// [0, numel) less `frozen` (sorted, disjoint), as runs in order.
ElementRanges TrainableRuns(int64_t numel, const ElementRanges& frozen) {
  ElementRanges runs;
  int64_t pos = 0;
  for (const auto& [b, e] : frozen) {
    if (b > pos) runs.emplace_back(pos, b);
    pos = std::max(pos, e);
  }
  if (pos < numel) runs.emplace_back(pos, numel);
  return runs;
}

// Calls each(lo, hi, decay_ranges of [lo, hi) shifted to start at 0) for every
// run of `ref` that trains.
template <typename Each>
void ForEachTrainableRun(const ParamRef& ref, const Each& each) {
  const int64_t numel = ref.param.numel();
  if (ref.frozen_ranges.empty()) {
    each(0, numel, ref.decay_ranges);
    return;
  }
  for (const auto& [lo, hi] : TrainableRuns(numel, ref.frozen_ranges)) {
    each(lo, hi, SliceRanges(ref.decay_ranges, lo, hi));
  }
}

}  // namespace

void Optimizer::ForEachDecaySegment(const ParamRef& ref,
                                    const std::function<void(int64_t, int64_t, bool)>& fn) {
  ForEachTrainableRun(ref, [&](int64_t lo, int64_t hi, const ElementRanges& decay_ranges) {
    DecaySegmentsInOrder(hi - lo, decay_ranges,
                         [&](int64_t b, int64_t e, bool d) { fn(lo + b, lo + e, d); });
  });
}

void Optimizer::ForEachSegment(const ParamRef& ref,
                               const std::function<void(int64_t, int64_t, bool)>& fn) {
  ForEachTrainableRun(ref, [&](int64_t lo, int64_t hi, const ElementRanges& decay_ranges) {
    DecaySegmentsInParallel(hi - lo, decay_ranges,
                            [&](int64_t b, int64_t e, bool d) { fn(lo + b, lo + e, d); });
  });
}

void Optimizer::DecaySegmentsInOrder(int64_t numel, const ElementRanges& decay_ranges,
                                     const std::function<void(int64_t, int64_t, bool)>& fn) {
  int64_t pos = 0;
  for (const auto& [b, e] : decay_ranges) {
    if (b > pos) fn(pos, std::min(b, numel), false);
    if (b < numel) fn(std::max(b, pos), std::min(e, numel), true);
    pos = std::max(pos, e);
  }
  if (pos < numel) fn(pos, numel, false);
}

void Optimizer::DecaySegmentsInParallel(int64_t numel, const ElementRanges& decay_ranges,
                                        const std::function<void(int64_t, int64_t, bool)>& fn) {
  tensor::ParallelFor(numel, kGrain, [&](int64_t begin, int64_t end) {
    // The first range that ends after `begin` (ends are sorted as ranges are disjoint).
    auto it = std::partition_point(decay_ranges.begin(), decay_ranges.end(),
                                   [begin](const auto& r) { return r.second <= begin; });
    int64_t pos = begin;
    while (pos < end) {
      if (it == decay_ranges.end() || it->first >= end) {
        fn(pos, end, false);
        break;
      }
      if (it->first > pos) {
        fn(pos, it->first, false);
        pos = it->first;
      }
      const int64_t hi = std::min(it->second, end);
      fn(pos, hi, true);
      pos = hi;
      ++it;
    }
  });
}

}  // namespace optim
