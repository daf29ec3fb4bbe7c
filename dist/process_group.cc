// dist::ProcessGroup: argument checks shared by the engines, synchronous
// forms, NewSubgroup on top of Split, and call descriptions for messages.
#include "dist/process_group.h"

#include <cstdint>
#include <cstring>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tensor/fnv.h"

namespace dist {

absl::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

absl::string_view CollectiveName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kBarrier:
      return "barrier";
  }
  return "?";
}

absl::Duration DefaultCollectiveTimeout() { return absl::Seconds(300); }

namespace {

std::string Numel(const tensor::Tensor& t) {
  return t.defined() ? absl::StrCat(t.numel()) : std::string("undefined");
}

std::string DtypeOf(const tensor::Tensor& t) {
  return t.defined() ? std::string(tensor::DtypeName(t.dtype())) : std::string("?");
}

}  // namespace

std::string DescribeCall(const CollectiveCall& call) {
  const std::string name(CollectiveName(call.kind));
  switch (call.kind) {
    case CollectiveKind::kAllReduce:
      return absl::StrCat(name, "(", ReduceOpName(call.op), ", ", DtypeOf(call.input), ", ",
                          Numel(call.input), " elements)");
    case CollectiveKind::kReduceScatter:
      return absl::StrCat(name, "(", ReduceOpName(call.op), ", ", DtypeOf(call.input), ", ",
                          Numel(call.input), " -> ", Numel(call.output), " elements)");
    case CollectiveKind::kAllGather:
      return absl::StrCat(name, "(", DtypeOf(call.input), ", ", Numel(call.input), " -> ",
                          Numel(call.output), " elements)");
    case CollectiveKind::kBroadcast:
      return absl::StrCat(name, "(root ", call.root, ", ", DtypeOf(call.input), ", ",
                          Numel(call.input), " elements)");
    case CollectiveKind::kBarrier:
      return absl::StrCat(name, "()");
  }
  return name;
}

std::string ProcessGroup::Who() const { return absl::StrCat("rank ", rank(), " of ", size()); }

WorkPtr ProcessGroup::CheckAndIssue(std::shared_ptr<CollectiveCall> shared) {
  CollectiveCall& call = *shared;
  const std::string op(CollectiveName(call.kind));
  auto invalid = [&](auto&&... pieces) {
    call.error = absl::InvalidArgumentError(absl::StrCat("[", op, "] ", Who(), ": ", pieces...));
  };
  const bool needs_output =
      call.kind == CollectiveKind::kReduceScatter || call.kind == CollectiveKind::kAllGather;
  if (call.kind == CollectiveKind::kBarrier) {
    // Nothing to check.
  } else if (!call.input.defined()) {
    invalid(needs_output ? "the input tensor is undefined" : "the tensor is undefined");
  } else if (needs_output && !call.output.defined()) {
    invalid("the output tensor is undefined");
  } else if (needs_output && call.input.dtype() != call.output.dtype()) {
    invalid("input dtype ", tensor::DtypeName(call.input.dtype()), " differs from output dtype ",
            tensor::DtypeName(call.output.dtype()));
  } else if ((call.kind == CollectiveKind::kAllReduce ||
              call.kind == CollectiveKind::kReduceScatter) &&
             call.op == ReduceOp::kAvg && !tensor::IsFloatingPoint(call.input.dtype())) {
    invalid("avg needs a floating-point dtype, got ", tensor::DtypeName(call.input.dtype()));
  } else if (call.kind == CollectiveKind::kReduceScatter && call.input.numel() % size() != 0) {
    invalid("input has ", call.input.numel(), " elements, not divisible by the group size ",
            size());
  } else if (call.kind == CollectiveKind::kReduceScatter &&
             call.output.numel() * size() != call.input.numel()) {
    invalid("output has ", call.output.numel(), " elements, expected input ", call.input.numel(),
            " / group size ", size(), " = ", call.input.numel() / size());
  } else if (call.kind == CollectiveKind::kAllGather &&
             call.input.numel() * size() != call.output.numel()) {
    invalid("output has ", call.output.numel(), " elements, expected group size ", size(),
            " x input ", call.input.numel(), " = ", call.input.numel() * size());
  } else if (call.kind == CollectiveKind::kBroadcast && (call.root < 0 || call.root >= size())) {
    invalid("root ", call.root, " is not a rank of a group of size ", size());
  }
  return Issue(std::move(shared));
}

WorkPtr ProcessGroup::AllReduce(const tensor::Tensor& tensor, ReduceOp op,
                                const CollectiveOptions& options) {
  auto shared = std::make_shared<CollectiveCall>();
  CollectiveCall& call = *shared;
  call.kind = CollectiveKind::kAllReduce;
  call.op = op;
  call.input = tensor;
  call.timeout = Resolve(options);
  call.ready_stream = options.ready_stream;
  return CheckAndIssue(std::move(shared));
}

WorkPtr ProcessGroup::ReduceScatter(const tensor::Tensor& input, const tensor::Tensor& output,
                                    ReduceOp op, const CollectiveOptions& options) {
  auto shared = std::make_shared<CollectiveCall>();
  CollectiveCall& call = *shared;
  call.kind = CollectiveKind::kReduceScatter;
  call.op = op;
  call.input = input;
  call.output = output;
  call.timeout = Resolve(options);
  call.ready_stream = options.ready_stream;
  return CheckAndIssue(std::move(shared));
}

WorkPtr ProcessGroup::AllGather(const tensor::Tensor& input, const tensor::Tensor& output,
                                const CollectiveOptions& options) {
  auto shared = std::make_shared<CollectiveCall>();
  CollectiveCall& call = *shared;
  call.kind = CollectiveKind::kAllGather;
  call.input = input;
  call.output = output;
  call.timeout = Resolve(options);
  call.ready_stream = options.ready_stream;
  return CheckAndIssue(std::move(shared));
}

WorkPtr ProcessGroup::Broadcast(const tensor::Tensor& tensor, int root,
                                const CollectiveOptions& options) {
  auto shared = std::make_shared<CollectiveCall>();
  CollectiveCall& call = *shared;
  call.kind = CollectiveKind::kBroadcast;
  call.input = tensor;
  call.root = root;
  call.timeout = Resolve(options);
  call.ready_stream = options.ready_stream;
  return CheckAndIssue(std::move(shared));
}

WorkPtr ProcessGroup::Barrier(const CollectiveOptions& options) {
  auto shared = std::make_shared<CollectiveCall>();
  CollectiveCall& call = *shared;
  call.kind = CollectiveKind::kBarrier;
  call.timeout = Resolve(options);
  call.ready_stream = options.ready_stream;
  return CheckAndIssue(std::move(shared));
}

absl::Status ProcessGroup::AllReduceSync(const tensor::Tensor& tensor, ReduceOp op,
                                         const CollectiveOptions& options) {
  return AllReduce(tensor, op, options)->Wait();
}

absl::Status ProcessGroup::ReduceScatterSync(const tensor::Tensor& input,
                                             const tensor::Tensor& output, ReduceOp op,
                                             const CollectiveOptions& options) {
  return ReduceScatter(input, output, op, options)->Wait();
}

absl::Status ProcessGroup::AllGatherSync(const tensor::Tensor& input, const tensor::Tensor& output,
                                         const CollectiveOptions& options) {
  return AllGather(input, output, options)->Wait();
}

absl::Status ProcessGroup::BroadcastSync(const tensor::Tensor& tensor, int root,
                                         const CollectiveOptions& options) {
  return Broadcast(tensor, root, options)->Wait();
}

absl::Status ProcessGroup::BarrierSync(const CollectiveOptions& options) {
  return Barrier(options)->Wait();
}

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Split(
    int color, int key, const CollectiveOptions& options) {
  return DoSplit(color, key, Resolve(options));
}

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::NewSubgroup(
    absl::Span<const int> ranks, const CollectiveOptions& options) {
  // Every rank must pass the same list: compare a fingerprint of it (and of
  // its validity here) across the ranks first, so that no rank builds a group
  // the others do not.
  std::string problem;
  std::set<int> seen;
  for (int r : ranks) {
    if (r < 0 || r >= size()) {
      problem = absl::StrCat("rank ", r, " is not in a group of size ", size());
      break;
    }
    if (!seen.insert(r).second) {
      problem = absl::StrCat("rank ", r, " is listed twice");
      break;
    }
  }
  uint64_t fingerprint = tensor::kFnv1aBasis;  // FNV-1a over the list, a rank a step.
  for (int r : ranks) {
    fingerprint = (fingerprint ^ static_cast<uint32_t>(r)) * tensor::kFnv1aPrime;
  }
  fingerprint = (fingerprint ^ ranks.size()) * tensor::kFnv1aPrime;
  if (!problem.empty()) fingerprint = 0;  // Invalid lists never match valid ones.
  absl::StatusOr<std::vector<int64_t>> gathered =
      AllGatherOverRanks(*this, static_cast<int64_t>(fingerprint), options);
  if (!gathered.ok()) return gathered.status();
  if (!problem.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("[new_subgroup] ", Who(), ": invalid ranks [",
                                                   absl::StrJoin(ranks, ", "), "]: ", problem));
  }
  const std::vector<int64_t>& prints = *gathered;
  std::vector<int> differ;
  for (int r = 0; r < size(); ++r) {
    if (prints[r] != prints[rank()]) differ.push_back(r);
  }
  if (!differ.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "[new_subgroup] ", Who(), differ.size() == 1 ? ": rank " : ": ranks ",
        absl::StrJoin(differ, ", "), " passed a different list of ranks than this rank's [",
        absl::StrJoin(ranks, ", "), "]"));
  }
  int position = -1;
  for (int i = 0; i < static_cast<int>(ranks.size()); ++i) {
    if (ranks[i] == rank()) position = i;
  }
  return Split(position >= 0 ? 0 : -1, position, options);
}

absl::StatusOr<double> SumOverRanks(ProcessGroup& pg, double x) {
  // The double's bits, as an int64 the all-gather copies unchanged.
  int64_t bits = 0;
  std::memcpy(&bits, &x, sizeof(x));
  absl::StatusOr<std::vector<int64_t>> all = AllGatherOverRanks(pg, bits, CollectiveOptions());
  if (!all.ok()) return all.status();
  double sum = 0;
  for (const int64_t b : *all) {
    double v = 0;
    std::memcpy(&v, &b, sizeof(v));
    sum += v;
  }
  return sum;
}

absl::StatusOr<std::vector<int64_t>> AllGatherOverRanks(ProcessGroup& pg, int64_t x,
                                                        const CollectiveOptions& options) {
  const tensor::Tensor in = tensor::Tensor::FromData<int64_t>({x}, {1});         // (1)
  tensor::Tensor all = tensor::Tensor::Empty({pg.size()}, tensor::Dtype::kI64);  // (ranks)
  absl::Status s = pg.AllGatherSync(in, all, options);
  if (!s.ok()) return s;
  return all.ToVector<int64_t>();
}

absl::StatusOr<bool> AnyOverRanks(ProcessGroup& pg, bool flag) {
  tensor::Tensor t = tensor::Tensor::FromVector({flag ? 1.0f : 0.0f}, {1});
  absl::Status s = pg.AllReduceSync(t, ReduceOp::kMax);
  if (!s.ok()) return s;
  return t.data<float>()[0] != 0.0f;
}

absl::StatusOr<double> MeanOverRanks(ProcessGroup& pg, double x) {
  absl::StatusOr<double> sum = SumOverRanks(pg, x);
  if (!sum.ok()) return sum.status();
  return *sum / pg.size();
}

}  // namespace dist
