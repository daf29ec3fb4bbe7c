// FSDP's unit, private to //dist:fsdp: FsdpUnit holds one wrapped module's
// FlatParameter and is that module's hooks (gather the parameters before its
// forward and backward, free them after, reduce-scatter its gradient);
// FsdpShared is what the units of one model share (the pass, the orders
// recorded for prefetch, the reduces in flight). FullyShardedModel (fsdp.h)
// builds and drives them.
#ifndef DIST_FSDP_UNIT_H_
#define DIST_FSDP_UNIT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "dist/flat_param.h"
#include "dist/fsdp.h"
#include "dist/offload_uploads.h"
#include "dist/process_group.h"
#include "dist/wrap_policy.h"
#include "nn/module.h"
#include "tensor/cuda_backend.h"
#include "tensor/tensor.h"

namespace dist {
namespace internal {

// What the units of one model share: the pass counter, the unit order recorded
// in the last forward and backward (for prefetch), the reduce-scatters in
// flight, the no_sync flag and the prefetch counts.
struct FsdpShared {
  FsdpOptions options;
  std::vector<FsdpUnit*> units;  // units[0] is the root
  // Incremented at the root's PreForward: gathers of an earlier pass are stale.
  int64_t pass = 0;
  // Unit ids in the order PreForward / PreBackward ran in the last complete
  // pass, and the ones of the pass running now. Forward-only passes (the
  // root held by Unshard / UnshardRoot) keep an order of their own: they may
  // run other units than training does (T5's decoding steps run the decoder
  // alone), and would otherwise make the next training forward's prefetch
  // gather units it does not run next.
  std::vector<int> training_forward_order, forward_only_order, backward_order;
  std::vector<int> forward_now, backward_now;
  // Per unit: the units its PreForward / PreBackward prefetches explicitly
  // (SetForwardPrefetch / SetBackwardPrefetch), or none set: the recorded
  // order's prefetch.
  std::vector<std::optional<std::vector<int>>> explicit_forward, explicit_backward;
  // Reduce-scatters issued and not yet finished, oldest first; then, under
  // HYBRID_SHARD, the units whose replicas' all-reduce is in flight.
  std::vector<FsdpUnit*> pending_reduces;
  std::vector<FsdpUnit*> pending_replicas;
  bool require_sync = true;
  // cpu_offload: page-locked host buffers of the largest shard, one per
  // dtype a unit moves through the host: its reduced gradient comes back
  // through one, and a low-precision copy of its shard goes out through one
  // where no upload slot (below) takes it (AllocateOffloadStaging, at
  // FullyShard). No step allocates page-locked memory then, which could
  // fail on one rank only: after its reduce, the other ranks stepped without
  // it; before its all-gather, they waited.
  std::map<tensor::Dtype, tensor::Tensor> offload_staging;
  // cpu_offload on a GPU, strategies that gather: each unit's shard goes up
  // for its all-gather on a stream of its own, through slots made at
  // FullyShard (offload_uploads.h; max_inflight_all_gathers per gather
  // dtype, fewer when fewer units gather in it); with none free, by a
  // blocking copy. (NO_SHARD's go up on the thread's stream: QueueUpload.)
  std::unique_ptr<OffloadUploads> uploads;
  // A stream of FSDP's own on the GPU (created and destroyed with it).
  struct SideStream {
    SideStream(const SideStream&) = delete;
    SideStream& operator=(const SideStream&) = delete;
    explicit SideStream(int device);
    ~SideStream();
    const int device;
    const tensor::cuda::StreamHandle stream;
  };
  // cpu_offload on a GPU: the stream a reduced gradient comes back to the
  // host on (AllocateOffloadStaging). Its reduce has finished when the copy
  // is queued; a blocking copy (on the legacy default stream) would wait for
  // the backward kernels every rank thread queued since too, and the GPU
  // would then idle while the host accumulates the gradient. Here those
  // kernels run meanwhile.
  std::unique_ptr<SideStream> offload_stream;
  // HYBRID_SHARD on a GPU: a stream with no work, the ready stream
  // (CollectiveOptions::ready_stream) of the replicas' all-reduce of a
  // unit's reduced gradient. Its reduce-scatter has finished when it is
  // issued (FinishReduce waited for it), so it needs to wait for nothing on
  // the device; behind the thread's stream it would wait for the backward
  // kernels queued since (a later unit's): the all-reduce between the nodes
  // would start only after them, and not overlap them.
  std::unique_ptr<SideStream> replicas_ready;
  // NO_SHARD offloaded on a GPU: recorded after each unit's upload, which is
  // queued on the thread's stream (FsdpUnit::QueueUpload). The host changes
  // the shards only through FullyShardedModel::ParamRefs (an optimizer step,
  // a sharded checkpoint's load), which waits for the last upload first
  // (WaitQueuedUploads), so no queued upload reads a shard being changed,
  // whatever ran before (a forward-only pass, Unshard, a forward that threw).
  // After a backward the uploads have finished (its all-reduces, issued
  // after them, were waited for): the wait costs nothing then.
  struct SideEvent {
    SideEvent(const SideEvent&) = delete;
    SideEvent& operator=(const SideEvent&) = delete;
    explicit SideEvent(int device);
    ~SideEvent();
    const int device;
    const tensor::cuda::EventHandle event;
  };
  std::unique_ptr<SideEvent> queued_upload;
  bool upload_queued = false;
  // The host waits for the last queued upload, if one is pending.
  void WaitQueuedUploads();
  FullyShardedModel::PrefetchStats prefetch_stats;
  int64_t all_gathers = 0;  // of unit parameters, since FullyShard

  // A forward-only pass: the root is held (Unshard / UnshardRoot), so no
  // backward follows it (one would throw).
  bool forward_only() const;
  // The recorded forward order for the kind of pass running now.
  std::vector<int>& forward_order();

  bool recorded(const std::vector<int>& order, const std::vector<int>& now) const {
    return now.size() <= order.size() && std::equal(now.begin(), now.end(), order.begin());
  }
  // Issues the all-gathers of the units that follow `now` in `order` (when the
  // pass so far matches it), up to max_inflight_all_gathers not yet used.
  void Prefetch(const std::vector<int>& order, const std::vector<int>& now);
  // Issues the all-gathers of `ids` (an explicit list) not issued this pass.
  // `in_backward`: after a first backward, only of the units it ran (the
  // model's backward stops below its lowest trainable parameter: a unit
  // under it would be gathered for nothing, and held until the root's
  // post-backward, past the peak). In a forward-only pass, after a first
  // one, only of the units the last one ran (T5's decoding steps run the
  // decoder alone: the root's list names encoder blocks).
  void PrefetchUnits(const std::vector<int>& ids, bool in_backward = false);
  // Allocates offload_staging for the units (each unit's OffloadDtypes), and
  // the offload_stream and the uploads' slots when `device` is a GPU.
  void AllocateOffloadStaging(const tensor::Device& device);
  // Copies `device_values` (final: their producer has finished) into
  // `host` (offload staging) and waits for the copy.
  void CopyToHost(const tensor::Tensor& device_values, tensor::Tensor& host) const;
  // The first `numel` values of the staging buffer of `dtype`.
  tensor::Tensor OffloadStaging(tensor::Dtype dtype, int64_t numel) const;
  // Finishes all but the newest `keep` pending reduces, then all but the
  // newest `keep` replicas' all-reduces (those of the reduces finished first
  // among them; never more than max(keep, 1) in flight after a reduce
  // finishes): under HYBRID_SHARD a unit's all-reduce between the nodes
  // runs while the host queues the next unit's backward (PyTorch's HSDP
  // queues it behind the reduce-scatter on its stream), and the host waits
  // for it one unit later. 0: every one (the root's post-backward, ZeroGrad).
  void FinishReducesBefore(size_t keep);
  // Finishes the pending reduces up to and including `unit`'s, and its
  // replicas' all-reduce (the oldest first, as every rank does).
  void FinishReducesThrough(const FsdpUnit* unit);
  void FinishOldestReduce();    // pending_reduces' first
  void FinishOldestReplicas();  // pending_replicas' first
  // At the end of a pass: reshards the units prefetched and not used (the
  // pass ran other units than its recorded order said), which would
  // otherwise hold their memory and count against max_inflight_all_gathers
  // until their next use.
  void FreeUnusedPrefetches();
  // At the root's PostBackward: frees the units the backward did not reach (a
  // model's backward stops below its lowest trainable parameter), which
  // SHARD_GRAD_OP and SetReshardAfterForward(false) kept gathered for it.
  void ReshardUnitsBackwardSkipped();
  // At the root's PostBackward: throws OpError naming a trainable parameter
  // that holds a gradient (written after its unit's backward by a module
  // outside the unit: no reduce takes it).
  void CheckNoGradientLeft() const;
};

class FsdpUnit : public nn::ModuleHooks {
 public:
  // `shard_pg`: the group this unit is sharded over; `replicate_pg`: HYBRID_SHARD's
  // group of ranks holding the same shard (else null). `kept_fp32`: parameters
  // of modules the mixed-precision policy keeps fp32.
  FsdpUnit(int id, UnitPlan plan, FsdpShared& shared, ProcessGroup& shard_pg,
           ProcessGroup* replicate_pg, const std::set<const nn::Parameter*>& kept_fp32);

  ~FsdpUnit() override;

  int id() const { return id_; }
  bool is_root() const { return id_ == 0; }
  const std::string& name() const { return name_; }
  nn::Module* module() const { return module_; }
  FlatParameter& flat() { return flat_; }
  const FlatParameter& flat() const { return flat_; }
  bool no_shard() const { return strategy_ == ShardingStrategy::kNoShard; }
  // FullyShardedModel::SetReshardAfterForward: overrides the strategy's rule.
  void set_reshard_after_forward(bool reshard) { reshard_after_forward_ = reshard; }
  // Low-precision compute copies (param_dtype not f32).
  bool mixed() const { return param_dtype_ != tensor::Dtype::kF32; }
  // NO_SHARD in fp32 on the compute device: parameter values are views of
  // the (whole) shard itself; nothing is ever gathered.
  bool values_are_shard() const { return no_shard() && !mixed() && !offload_; }

  void Init(uint64_t seed);

  // cpu_offload: the dtypes this unit's shard-sized values cross between
  // host and device through a staging buffer in (its reduced gradient's;
  // its gather dtype when not fp32, cast on the host, where no upload slot
  // takes it); none without offload.
  std::vector<tensor::Dtype> OffloadDtypes() const;
  // cpu_offload: the dtype this unit's shard goes up in for an all-gather
  // (an upload slot's), or none (nothing gathered: NO_SHARD, or no offload).
  std::optional<tensor::Dtype> UploadDtype() const;

  // Gathers the unsharded fp32 flat parameter into `out` (padded_numel, on
  // the compute device).
  void GatherInto(const tensor::Tensor& out);

  // ---- Unsharding: issue (maybe early, a prefetch), then wait ----

  // True when this pass's gather is issued or done and not yet resharded.
  bool gathered_this_pass() const { return gather_pass_ == shared_.pass && full_.defined(); }
  bool prefetched() const { return prefetched_; }
  // Holds an unsharded flat parameter (gathered, prefetched or held).
  bool unsharded() const { return full_.defined(); }

  // Issues the all-gather of this pass unless already issued. `prefetch`: for
  // a later module (counted against max_inflight_all_gathers until used).
  void IssueUnshard(bool prefetch);

  // Waits for this pass's gather and points the parameters at it.
  void WaitUnshard();

  void Unshard();

  // Gathered now, and kept so (hooks gather and free nothing) until Reshard
  // (FullyShardedModel::Unshard / UnshardRoot).
  void Hold();
  bool held() const { return held_; }

  void Reshard();

  // ---- Hooks ----

  void PreForward(nn::Module&) override;
  void PostForward(nn::Module&) override;
  void PreBackward(nn::Module&) override;
  void PostBackward(nn::Module&) override;

  // ---- Gradient reduction ----

  // Issues the reduce-scatter (all-reduce under NO_SHARD) of the unsharded
  // gradient in this unit's reduce dtype (reduce_dtype_: f32 for a group of
  // one, or a unit that trains a kept-fp32 parameter); the buffers live until
  // FinishReduce (the result's, under HYBRID_SHARD, until FinishReplicas).
  void IssueReduce();

  // Waits for the reduce; then adds the result into the fp32 gradient shard
  // (offloaded: copied to the host in the reduce dtype first), or, under
  // HYBRID_SHARD, frees the unsharded gradient and issues the all-reduce
  // that averages the result over the replicas (FinishReplicas adds it).
  // Memory: with shard groups of more than 1, the result is a shard-sized
  // buffer of its own (kCommunication), and up to 2 of them wait in the
  // replicas' all-reduces beside the reduces in flight.
  void FinishReduce();
  // The replicas' all-reduce is in flight (FinishReduce issued it).
  bool averaging_replicas() const { return replicas_work_ != nullptr; }
  // Waits for the replicas' all-reduce and adds the result into the fp32
  // gradient shard, as FinishReduce does without replicas.
  void FinishReplicas();
  // A reduce or a replicas' all-reduce is in flight.
  bool reducing() const { return reduce_work_ != nullptr || replicas_work_ != nullptr; }

  // Drops the unsharded gradient accumulated under no_sync.
  // Also the gradient views a backward that threw left (PostBackward clears
  // them otherwise).
  void DropAccumulatedGrad() {
    full_grad_ = tensor::Tensor();
    flat_.ClearGrads();
  }

 private:
  bool reshards_after_forward() const {
    return reshard_after_forward_.value_or(ReshardsAfterForward(strategy_));
  }

  // This rank's shard in `dtype` on the compute device: the shard itself, or
  // a copy (offloaded: cast on the host first, into the page-locked staging
  // buffer, so fewer bytes cross to the device).
  tensor::Tensor ShardOnDevice(tensor::Dtype dtype) const;
  // NO_SHARD offloaded on a GPU: the unit's values in the gather dtype on
  // the GPU, copied there on this thread's stream without a host wait (a
  // blocking copy waited for every kernel queued before it); a low-precision
  // dtype is cast on the device after an f32 copy, as PyTorch FSDP casts its
  // offloaded parameters. Records FsdpShared::queued_upload after the copy.
  tensor::Tensor QueueUpload();
  // Waits for the all-gather in flight, frees its upload slot when it
  // succeeded, and throws naming the unit when it failed.
  void WaitGather();
  // The gather's upload slot is no longer read: free for the next upload
  // when `read_finished` (the gather succeeded), else left in use.
  void DropGatherSlot(bool read_finished);

  // Adds reduce_out_ (this rank's reduced gradient) into the gradient shard,
  // through the host's staging buffer when offloaded, and frees the buffers.
  void AccumulateReduced();
  // Check(s, what) for a reduce or the replicas' all-reduce, whose buffers
  // go first when it failed (the collective has ended).
  void CheckReduced(const absl::Status& s, const char* what);

  void Check(const absl::Status& s, const char* what);

  int id_;
  std::string name_;
  nn::Module* module_;
  FsdpShared& shared_;
  ProcessGroup& pg_;
  ProcessGroup* replicate_pg_;
  ShardingStrategy strategy_;
  tensor::Device device_;  // compute
  bool offload_;           // shards in host memory
  tensor::Dtype param_dtype_;
  tensor::Dtype reduce_dtype_;
  tensor::Dtype gather_dtype_ = tensor::Dtype::kF32;
  std::vector<bool> keep_fp32_;  // per flat entry (mixed precision only)
  FlatParameter flat_;
  // Unsharding: the unsharded flat parameter (padded_numel, gather dtype;
  // undefined while sharded), the pass it was gathered in, the all-gather in
  // flight and its low-precision send buffer.
  tensor::Tensor full_;
  int64_t gather_pass_ = -1;
  bool held_ = false;  // Hold() until Reshard()
  WorkPtr gather_work_;
  tensor::Tensor gather_send_;
  int gather_slot_ = -1;  // cpu_offload on a GPU: the upload slot it sends
  bool views_set_ = false;
  bool prefetched_ = false;
  std::optional<bool> reshard_after_forward_;  // unset: the strategy's rule
  // The unsharded fp32 gradient (padded_numel; from PreBackward to
  // PostBackward, or across backwards under no_sync), and the reduce in
  // flight: its buffer (reduce dtype) and where this rank's result lands
  // (a view of it, or under HYBRID_SHARD a buffer of its own), and the
  // replicas' all-reduce in flight over that result.
  tensor::Tensor full_grad_;
  tensor::Tensor reduce_buf_;
  tensor::Tensor reduce_out_;
  WorkPtr reduce_work_;
  WorkPtr replicas_work_;
};

}  // namespace internal
}  // namespace dist

#endif  // DIST_FSDP_UNIT_H_
