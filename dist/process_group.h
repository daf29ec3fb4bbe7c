// dist::ProcessGroup: the collective-communication interface that every engine
// (threads, gloo, nccl) implements, and that DDP / ZeRO / FSDP are written
// against.
//
// A ProcessGroup handle belongs to one rank. Collectives are asynchronous:
// each returns a Work whose Wait() gives the result; the ...Sync forms issue
// and wait. A rank's collectives on one group run in the order they were
// issued, and every rank of the group must issue the same collectives in the
// same order (as with NCCL); the engines detect calls that do not match
// (another op, dtype or size) and fail them on every rank with a message that
// names the ranks and what each called.
//
// Every collective has a timeout (the group's, or CollectiveOptions::timeout),
// counted from when this rank's engine starts the call (after the calls issued
// before it): a peer that never arrives makes the call fail with
// DeadlineExceeded and a message naming the op, this rank and the ranks it
// waited for:
//   "[all_reduce] rank 1 of 4 timed out after 2.0 s waiting for ranks 2, 3"
// After a timeout (or a peer that left) the group is unusable (its ranks
// disagree about which calls were made): every later call fails at once with
// the error that aborted it. Mismatched or invalid calls fail on every rank
// alike and leave the group usable (threads, gloo; the nccl engine cannot
// compare calls across ranks: see dist/nccl_group.h).
//
// Tensors: contiguous CPU tensors (engines may accept more) of f32, f16, bf16
// (reduced in f32, rounded once), i32, i64 and u8. Buffers must stay alive and
// untouched until the Work is complete; the engines keep the storage alive.
#ifndef DIST_PROCESS_GROUP_H_
#define DIST_PROCESS_GROUP_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "dist/work.h"
#include "tensor/tensor.h"

namespace dist {

enum class ReduceOp : uint8_t { kSum, kAvg, kMax, kMin };

// "sum", "avg", "max", "min".
absl::string_view ReduceOpName(ReduceOp op);

enum class CollectiveKind : uint8_t {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kBarrier
};

// "all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier".
absl::string_view CollectiveName(CollectiveKind kind);

// The timeout of a group when none is given: 300 s.
absl::Duration DefaultCollectiveTimeout();

struct CollectiveOptions {
  // Overrides the group's timeout for this call.
  std::optional<absl::Duration> timeout;
  // Tensors on a GPU: the stream (a tensor::cuda::StreamHandle of their
  // device) whose work queued so far the call waits for before it reads its
  // input or writes its output, in place of the issuing thread's stream (the
  // nccl engine: the group's compute stream, which the call then does not
  // wait for). The caller makes that stream wait for what the call depends
  // on: the input's writers, and the earlier users of the output's memory.
  // FSDP's offloaded all-gathers wait so for their shard's upload and the
  // thread's stream, and the thread's later kernels do not wait for the
  // upload; HYBRID_SHARD's replicas' all-reduce, whose input is final, for
  // an idle stream. nullptr: the default; host tensors, the threads engine's barrier
  // (no tensors) and the gloo engine (no GPU tensors) ignore it.
  void* ready_stream = nullptr;

  static CollectiveOptions WithTimeout(absl::Duration timeout) {
    CollectiveOptions options;
    options.timeout = timeout;
    return options;
  }
};

// One collective call as an engine receives it.
struct CollectiveCall {
  CollectiveKind kind = CollectiveKind::kBarrier;
  ReduceOp op = ReduceOp::kSum;  // all_reduce, reduce_scatter
  // all_reduce, broadcast: the tensor (in place). reduce_scatter: (size * k)
  // elements. all_gather: (k) elements, this rank's piece.
  tensor::Tensor input;
  // reduce_scatter: (k) elements, the reduction of chunk rank() of every
  // input. all_gather: (size * k) elements, every rank's input in rank order.
  tensor::Tensor output;
  int root = 0;  // broadcast
  absl::Duration timeout;
  void* ready_stream = nullptr;  // CollectiveOptions::ready_stream
  // Set when this rank's arguments are invalid; engines still rendezvous so
  // that the peers fail at once with this message instead of timing out.
  absl::Status error;
};

// "all_reduce(sum, f32, 10 elements)", "all_gather(bf16, 3 -> 12 elements)",
// "broadcast(root 0, f32, 7 elements)", "barrier()". For mismatch messages.
std::string DescribeCall(const CollectiveCall& call);

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // This rank's index in the group, in [0, size()).
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "threads", "gloo" or "nccl".
  virtual absl::string_view backend() const = 0;

  // The timeout of calls that do not set CollectiveOptions::timeout. Each
  // rank's handle has its own; set it from the thread that issues the calls.
  absl::Duration timeout() const { return timeout_; }
  void set_timeout(absl::Duration timeout) { timeout_ = timeout; }

  // ---- Asynchronous collectives ----
  // Reduces `tensor` across the ranks, in place, on every rank.
  [[nodiscard]] WorkPtr AllReduce(const tensor::Tensor& tensor, ReduceOp op = ReduceOp::kSum,
                                  const CollectiveOptions& options = {});
  // input (size() * k) -> output (k): this rank gets the reduction of chunk
  // rank() of every rank's input. `output` may be this rank's chunk of
  // `input` (in place).
  [[nodiscard]] WorkPtr ReduceScatter(const tensor::Tensor& input, const tensor::Tensor& output,
                                      ReduceOp op = ReduceOp::kSum,
                                      const CollectiveOptions& options = {});
  // input (k) -> output (size() * k): the concatenation of every rank's input
  // in rank order. `input` may be this rank's chunk of `output` (in place: the
  // FSDP flat-parameter layout).
  [[nodiscard]] WorkPtr AllGather(const tensor::Tensor& input, const tensor::Tensor& output,
                                  const CollectiveOptions& options = {});
  // Copies root's `tensor` into every rank's `tensor`.
  [[nodiscard]] WorkPtr Broadcast(const tensor::Tensor& tensor, int root,
                                  const CollectiveOptions& options = {});
  // Completes once every rank has reached it.
  [[nodiscard]] WorkPtr Barrier(const CollectiveOptions& options = {});

  // ---- Synchronous forms: issue, then Wait() ----
  absl::Status AllReduceSync(const tensor::Tensor& tensor, ReduceOp op = ReduceOp::kSum,
                             const CollectiveOptions& options = {});
  absl::Status ReduceScatterSync(const tensor::Tensor& input, const tensor::Tensor& output,
                                 ReduceOp op = ReduceOp::kSum,
                                 const CollectiveOptions& options = {});
  absl::Status AllGatherSync(const tensor::Tensor& input, const tensor::Tensor& output,
                             const CollectiveOptions& options = {});
  absl::Status BroadcastSync(const tensor::Tensor& tensor, int root,
                             const CollectiveOptions& options = {});
  absl::Status BarrierSync(const CollectiveOptions& options = {});

  // ---- Subgroups: collective over this group (every rank calls, in order
  // with its other collectives; waits for the calls issued before it) ----
  // The ranks that pass the same color >= 0 form a new group, ordered by
  // (key, rank()). A negative color joins no group: the result is nullptr.
  // HYBRID_SHARD: Split(rank / ranks_per_node) gives the shard groups and
  // Split(rank % ranks_per_node) the replicate groups.
  absl::StatusOr<std::unique_ptr<ProcessGroup>> Split(int color, int key,
                                                      const CollectiveOptions& options = {});
  absl::StatusOr<std::unique_ptr<ProcessGroup>> Split(int color) { return Split(color, rank()); }
  // A group of `ranks` (distinct ranks of this group; new rank i is ranks[i]).
  // Every rank calls it with the same list (checked); ranks not in the list
  // get nullptr.
  absl::StatusOr<std::unique_ptr<ProcessGroup>> NewSubgroup(absl::Span<const int> ranks,
                                                            const CollectiveOptions& options = {});

 protected:
  explicit ProcessGroup(absl::Duration timeout) : timeout_(timeout) {}

  // Runs `call` asynchronously (the engine keeps it, and so its tensors,
  // alive until done). call->error is set when the arguments are invalid on
  // this rank (the engine should fail the call on every rank).
  virtual WorkPtr Issue(std::shared_ptr<CollectiveCall> call) = 0;
  virtual absl::StatusOr<std::unique_ptr<ProcessGroup>> DoSplit(int color, int key,
                                                                absl::Duration timeout) = 0;

  // "rank 1 of 4": how messages name this rank (engines may add the group).
  virtual std::string Who() const;

 private:
  // Checks the arguments (setting call.error when invalid), then Issue()s.
  WorkPtr CheckAndIssue(std::shared_ptr<CollectiveCall> call);
  absl::Duration Resolve(const CollectiveOptions& options) const {
    return options.timeout.has_value() ? *options.timeout : timeout_;
  }

  absl::Duration timeout_;
};

// The sum over the ranks of a double (a loss, a squared norm), the same on
// every rank: each rank's value travels whole (its 8 bytes, through an int64
// all-gather: collectives have no f64) and the values are added in double in
// rank order. A value past f32's range (a squared norm of 1e39) or an
// infinite one adds as it is. Errors are the all-gather's.
absl::StatusOr<double> SumOverRanks(ProcessGroup& pg, double x);
// SumOverRanks / size.
absl::StatusOr<double> MeanOverRanks(ProcessGroup& pg, double x);
// Every rank's `x`, in rank order, the same on every rank (an all-gather of
// one i64 per rank): e.g. a fingerprint each rank computed alone, to check
// that all computed the same. Errors are the all-gather's.
absl::StatusOr<std::vector<int64_t>> AllGatherOverRanks(ProcessGroup& pg, int64_t x,
                                                        const CollectiveOptions& options = {});
// True on every rank when `flag` is true on any rank (an all-reduce max of
// one element): e.g. an inf/nan some rank found in its gradient shard, so
// that every rank skips the step. Errors are the all-reduce's.
absl::StatusOr<bool> AnyOverRanks(ProcessGroup& pg, bool flag);

}  // namespace dist

#endif  // DIST_PROCESS_GROUP_H_
