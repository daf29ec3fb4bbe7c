// Optimizer: the interface SGD and AdamW share, and the per-parameter state
// they keep. State is created lazily, per ParamRef name, on the first Step
// that sees the name: a step counter and fp32 buffers shaped like the
// parameter, allocated under MemoryCategory::kOptimizerState so the memory
// ledger counts exactly what StateBytes() reports. State is saved and restored
// as named tensors ("<param>.exp_avg", "<param>.step", ...) for checkpoints.
#ifndef OPTIM_OPTIMIZER_H_
#define OPTIM_OPTIMIZER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "optim/param_ref.h"
#include "tensor/tensor.h"

namespace optim {

using NamedTensors = std::vector<std::pair<std::string, tensor::Tensor>>;

// The state of one parameter (or shard).
struct ParamState {
  // Steps taken with this parameter, this one included while Update runs.
  int64_t step = 0;
  // One fp32 buffer per Optimizer::BufferNames() entry, shaped like the
  // parameter, contiguous, on the CPU.
  std::vector<tensor::Tensor> buffers;
};

// Throws tensor::OpError when a deferred GPU check on a device of `params`
// failed (tensor/cuda_backend.h: an embedding's out-of-range id), waiting for
// pending ones first; once per device. Nothing for CPU params. What a step
// calls before it changes anything (Optimizer::Step, dist::Zero1::Step).
void RaiseDeferredGpuChecks(const std::vector<ParamRef>& params);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // "sgd", "adamw": starts error messages.
  virtual const char* name() const = 0;
  // The hyperparameters besides the learning rate (which a schedule changes
  // during training), as one line that compares equal for equal settings:
  // "adamw(beta1=0.9,beta2=0.95,eps=1e-08,weight_decay=0.1)". Checkpoints
  // record it, so that a resumed run can say what differs.
  virtual std::string Settings() const = 0;
  // Keys of the per-parameter buffers, in ParamState::buffers order
  // ("momentum_buffer"; "exp_avg", "exp_avg_sq"). "step" is always kept too.
  virtual std::vector<std::string> BufferNames() const = 0;

  // Updates every ref in place with the current lr (and its
  // low_precision_copy, when it has one), creating state for names
  // seen the first time on the param's device (state on another device, such
  // as host tensors loaded from a checkpoint for a GPU parameter, moves to
  // the param's device first). Throws tensor::OpError, before changing anything,
  // when a ref is invalid (see CheckParamRefs) or its shape differs from the
  // state kept under its name, or when a deferred GPU check of the params'
  // devices failed (tensor/cuda_backend.h: an embedding's out-of-range id;
  // pending ones are waited for first).
  void Step(const std::vector<ParamRef>& params);

  double lr() const { return lr_; }
  // lr must be finite and >= 0 (throws tensor::OpError otherwise).
  void set_lr(double lr);

  // Bytes of all state buffers (what the ledger charges to kOptimizerState).
  int64_t StateBytes() const;
  // Steps taken with `param_name` (0 when it has no state).
  int64_t StepCount(const std::string& param_name) const;
  bool HasState(const std::string& param_name) const { return state_.count(param_name) > 0; }
  // Drops all state (frees its memory).
  void ClearState();

  // The state as named tensors, parameters in the order their state was
  // created: "<param>.step" (a 1-element i64 copy) then "<param>.<key>" for
  // each BufferNames() key (the live buffers themselves, not copies).
  NamedTensors StateTensors() const;

  // Replaces the whole state with `tensors` (as StateTensors() gives them;
  // any order). Each parameter needs "<param>.step" (one element, integral,
  // >= 0, any numeric dtype) and every buffer key (f32, CPU, all of one
  // shape). Also an error: an entry with an unknown key or given twice, and
  // a parameter whose current state has another shape or that has state now
  // but none in `tensors`. Data is copied (into fresh kOptimizerState
  // buffers, or into the existing ones where shapes agree). On error the
  // state is left unchanged and the message names the offending entry.
  absl::Status LoadStateTensors(const NamedTensors& tensors);
  // As above, and the loaded parameters must be exactly the names of
  // `params`, each with buffers of its ref's param shape; the state is kept
  // on each param's device (a CUDA shard's state on the GPU).
  absl::Status LoadStateTensors(const NamedTensors& tensors, const std::vector<ParamRef>& params);
  // As LoadStateTensors(tensors), but a buffer entry that is f32, contiguous
  // and on the CPU becomes the state buffer itself instead of being copied
  // (unless the current state has a buffer of its shape to copy into), so
  // loading a checkpoint's state read from disk does not hold it twice. The
  // caller hands the tensors over: they must not be used afterwards.
  absl::Status AdoptStateTensors(NamedTensors tensors);
  // LoadStateTensors(tensors)'s checks alone: the same error where it would
  // fail, and nothing changes either way (a checkpoint load checks the
  // optimizer's state before it writes the model's weights).
  absl::Status CheckStateTensors(const NamedTensors& tensors);

 protected:
  explicit Optimizer(double lr) : lr_(lr) {}

  // Applies one step to `ref`; state.step has already been incremented and
  // state.buffers exist (zeros when just created).
  virtual void Update(const ParamRef& ref, ParamState& state) = 0;
  // One step of every param (the same preconditions); by default Update each
  // in order. An optimizer overrides it to update GPU params of many tensors
  // in a few kernel launches.
  struct Updating {
    const ParamRef* ref;
    ParamState* state;
  };
  virtual void UpdateAll(const std::vector<Updating>& params);
  // Whether Update / UpdateAll write `ref`'s low_precision_copy themselves
  // (in their pass over the parameter); otherwise Step casts the updated
  // param into it afterwards.
  virtual bool WritesLowPrecisionCopy(const ParamRef& ref) const { return false; }

  // The elements of `ref` an update touches: [0, numel) less its frozen
  // ranges, split where its decay ranges begin and end; fn(begin, end, decay)
  // tells whether [begin, end) is decayed.
  // ForEachSegment: in parallel chunks (tensor::ParallelFor), each split again.
  // ForEachDecaySegment: the segments in order on this thread, whole (for
  // device kernels, which parallelize a segment themselves).
  static void ForEachDecaySegment(const ParamRef& ref,
                                  const std::function<void(int64_t, int64_t, bool)>& fn);
  static void ForEachSegment(const ParamRef& ref,
                             const std::function<void(int64_t, int64_t, bool)>& fn);

 private:
  // ForEachDecaySegment / ForEachSegment over [0, numel) and its decay ranges.
  static void DecaySegmentsInOrder(int64_t numel, const ElementRanges& decay_ranges,
                                   const std::function<void(int64_t, int64_t, bool)>& fn);
  static void DecaySegmentsInParallel(int64_t numel, const ElementRanges& decay_ranges,
                                      const std::function<void(int64_t, int64_t, bool)>& fn);

  // check_only: return after the checks, before anything is allocated or
  // changed.
  absl::Status Load(const NamedTensors& tensors, const std::vector<ParamRef>* params,
                    bool adopt = false, bool check_only = false);

  double lr_;
  std::vector<std::string> order_;  // parameter names, in order of state creation
  std::unordered_map<std::string, ParamState> state_;
};

}  // namespace optim

#endif  // OPTIM_OPTIMIZER_H_
