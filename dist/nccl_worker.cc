// The host side of the `nccl` engine's calls: PollUntil, the CallWorker
// thread (in-order start, completion polling, timeouts that name the missing
// ranks and break the group) and the tensor rules of NCCL calls.
#include "dist/nccl_worker.h"

#include <algorithm>
#include <optional>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dist/nccl_rendezvous.h"

namespace dist {
namespace nccl {

absl::StatusOr<bool> PollUntil(absl::FunctionRef<absl::StatusOr<bool>()> poll, absl::Time deadline,
                               const Clock& clock, absl::Duration max_sleep) {
  absl::Duration sleep = absl::Microseconds(1);
  while (true) {
    absl::StatusOr<bool> done = poll();
    if (!done.ok() || *done) return done;
    const absl::Time now = clock.now();
    if (now >= deadline) return false;
    clock.sleep(std::min(sleep, deadline - now));
    sleep = std::min(2 * sleep, max_sleep);
  }
}

CallWorker::CallWorker(CallWorkerOptions options)
    : options_(std::move(options)), thread_([this] { Loop(); }) {}

CallWorker::~CallWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    // Peers waiting in a call this rank never issued fail at once (a broken
    // group said so with the number of the call that failed).
    if (TracksPeers() && broken_.ok()) {
      PublishGone(*options_.store, options_.prefix, options_.rank, submitted_,
                  absl::StrCat("its group was destroyed after issuing ", submitted_,
                               submitted_ == 1 ? " call" : " calls",
                               " (the rank finished, or stopped on an error outside this group)"))
          .IgnoreError();
    }
  }
  cv_.notify_all();
  thread_.join();
}

WorkPtr CallWorker::Submit(std::string op, absl::Duration timeout,
                           std::shared_ptr<PendingCall> call) {
  auto work = std::make_shared<CompletionWork>();
  absl::Status rejected;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.ok()) {
      rejected = BrokenErrorLocked(op);
    } else {
      Item item;
      item.op = std::move(op);
      item.timeout = timeout;
      item.number = submitted_++;
      item.call = std::move(call);
      item.work = work;
      queue_.push_back(std::move(item));
      // After the push, which may throw: a ticket taken must be passed.
      if (options_.launch_order && queue_.back().call->Launches()) {
        queue_.back().ticket = options_.launch_order->Take();
      }
    }
  }
  if (!rejected.ok()) {
    work->Complete(rejected);
    return work;
  }
  cv_.notify_all();
  return work;
}

namespace {

// How long an error in a subgroup waits for its peers' world ranks in the
// store, all at once (set when the split made the group, so normally there).
constexpr absl::Duration kWorldRankWait = absl::Milliseconds(200);

// A call this rank refused: it starts once every earlier call has finished,
// and fails (breaking the group) with the refusal.
class RefusedCall final : public PendingCall {
 public:
  explicit RefusedCall(absl::Status error) : error_(std::move(error)) {}
  absl::Status Start() override { return error_; }
  absl::StatusOr<bool> Finished() override { return true; }
  bool NeedsIdle() const override { return true; }
  bool Launches() const override { return false; }  // holds no turn of the family
  const absl::Status& error() const { return error_; }

 private:
  const absl::Status error_;
};

}  // namespace

WorkPtr CallWorker::Refuse(std::string op, absl::Duration timeout, absl::Status error) {
  if (options_.size == 1) return Work::Done(std::move(error));
  if (!broken().ok()) {
    const absl::Status broken_error = BrokenError(op);
    return Work::Done(absl::Status(
        broken_error.code(),
        absl::StrCat(broken_error.message(), " (and this call was refused: ", error.message(),
                     ")")));
  }
  return Submit(std::move(op), timeout, std::make_shared<RefusedCall>(std::move(error)));
}

int64_t CallWorker::submitted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return submitted_;
}

absl::Status CallWorker::broken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_;
}

absl::Status CallWorker::BrokenError(absl::string_view op) const {
  std::lock_guard<std::mutex> lock(mu_);
  return BrokenErrorLocked(op);
}

absl::Status CallWorker::BrokenErrorLocked(absl::string_view op) const {
  return absl::Status(
      broken_.code(),
      absl::StrCat("[", op, "] ", Who(options_.rank, options_.size, options_.label),
                   ": the group is unusable after an earlier failure: ", broken_.message()));
}

absl::Status CallWorker::CallError(const Item& item, const absl::Status& status) const {
  return absl::Status(
      status.code(),
      absl::StrCat("[", item.op, "] ", Who(options_.rank, options_.size, options_.label), ": ",
                   status.message()));
}

absl::Status CallWorker::TimeoutError(const Item& item) {
  const int64_t issued = submitted();
  ProgressReport report =
      ReportProgress(options_.store, options_.prefix, options_.rank, options_.size, item.number,
                     issued, options_.report_wait);
  if (!options_.label.empty() && options_.store != nullptr) {  // a subgroup: world ranks too
    report.world_ranks = ReadWorldRanks(*options_.store, options_.prefix, options_.size,
                                        report.missing, kWorldRankWait);
  }
  return CallTimeoutError(item.op, options_.rank, options_.size, item.timeout, item.number, report,
                          options_.report_wait, options_.label);
}

bool RunWithin(std::function<void()> fn, absl::Duration limit) {
  struct Returned {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto returned = std::make_shared<Returned>();
  // The thread holds its own copies: it may outlive the caller.
  auto run = [fn = std::move(fn), returned] {
    fn();
    {
      std::lock_guard<std::mutex> lock(returned->mu);
      returned->done = true;
    }
    returned->cv.notify_all();
  };
  std::thread runner;
  try {
    runner = std::thread(run);
  } catch (const std::system_error&) {  // no thread to spare: run here, unbounded
    run();
    return true;
  }
  bool done = false;
  {
    std::unique_lock<std::mutex> lock(returned->mu);
    if (limit == absl::InfiniteDuration()) {  // no chrono overflow
      returned->cv.wait(lock, [&] { return returned->done; });
      done = true;
    } else {
      done = returned->cv.wait_for(lock, absl::ToChronoNanoseconds(limit),
                                   [&] { return returned->done; });
    }
  }
  if (done) {
    runner.join();
  } else {
    runner.detach();
  }
  return done;
}

bool CallWorker::RunAbort() {
  if (!options_.abort) return true;
  return RunWithin(
      [start = options_.on_thread_start, abort = options_.abort] {
        if (start) start();  // the worker's device, as the abort expects
        abort();
      },
      options_.abort_timeout);
}

void CallWorker::Break(Item& failed, const absl::Status& error) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    first = broken_.ok();
    if (first) broken_ = error;
    // The queued calls will never launch: the family's later calls need not
    // wait for the report and the abort below (worker, then order: the
    // locks' one order).
    for (Item& item : queue_) PassTurn(item);
  }
  // Before the abort, which may take long: peers waiting in this call or a
  // later one fail at once instead of timing out. The abort ends this rank's
  // calls in flight before it too (failed is the newest when it failed to
  // start).
  if (first && TracksPeers()) {
    int64_t first_unrun = failed.number;
    for (const Item& other : in_flight_) first_unrun = std::min(first_unrun, other.number);
    PublishGone(*options_.store, options_.prefix, options_.rank, first_unrun, error.message())
        .IgnoreError();
  }
  absl::Status failure = error;
  const bool aborted = RunAbort();
  if (!aborted) {
    failure = absl::Status(
        error.code(),
        absl::StrCat(error.message(), " (then the communicator's abort did not return within ",
                     absl::FormatDuration(options_.abort_timeout),
                     ": its buffers stay allocated; this process should exit)"));
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = failure;  // later calls name it too
  }
  // Buffers are released before the waiters wake; kept for good when the
  // abort did not return, since the kernels may still write them.
  std::vector<std::shared_ptr<PendingCall>> kept;
  auto release = [&](Item& item) {
    if (aborted) {
      item.call.reset();
    } else {
      kept.push_back(std::move(item.call));
    }
  };
  release(failed);
  for (Item& other : in_flight_) {
    if (&other != &failed) release(other);
  }
  if (!aborted && options_.abandon) options_.abandon(std::move(kept));
  kept.clear();
  failed.work->Complete(failure);
  for (Item& other : in_flight_) {
    if (&other != &failed) other.work->Complete(BrokenError(other.op));
  }
  in_flight_.clear();
}

absl::Status CallWorker::PeerGone(const Item& item) {
  const std::optional<GonePeer> gone = FindGonePeer(*options_.store, options_.prefix,
                                                    options_.rank, options_.size, item.number,
                                                    gone_);
  if (!gone.has_value()) return absl::OkStatus();
  std::vector<int> world_ranks;  // a subgroup's: the peer's world rank too
  if (!options_.label.empty()) {
    world_ranks = ReadWorldRanks(*options_.store, options_.prefix, options_.size, {gone->rank},
                                 kWorldRankWait);
  }
  return PeerGoneError(item.op, options_.rank, options_.size, item.number, *gone,
                       options_.label, world_ranks);
}

void CallWorker::PassTurn(Item& item) {
  if (item.ticket < 0) return;
  options_.launch_order->Pass(item.ticket);
  item.ticket = -1;
}

bool CallWorker::StartItem(Item& item) {
  const absl::Time start = options_.clock.now();
  if (absl::Status started = item.call->Start(); !started.ok()) {
    PassTurn(item);
    // The peers' timeouts on this call name this rank: it issued only the
    // calls before it.
    if (options_.store != nullptr) {
      PublishIssued(*options_.store, options_.prefix, options_.rank, item.number).IgnoreError();
    }
    const auto* refused = dynamic_cast<const RefusedCall*>(item.call.get());
    Break(item, refused != nullptr ? refused->error() : CallError(item, started));
    return false;
  }
  PendingCall* call = item.call.get();
  // A call whose enqueue waits for its peers (a split; NCCL connecting on a
  // first call) fails at once too when one of them is gone before it.
  absl::Time next_peer_check = ChecksPeers() ? start + options_.peer_check_interval
                                             : absl::InfiniteFuture();
  absl::Status peer_gone;
  absl::StatusOr<bool> enqueued = PollUntil(
      [&]() -> absl::StatusOr<bool> {
        absl::StatusOr<bool> done = call->Enqueued();
        if (!done.ok() || *done) return done;
        if (options_.clock.now() >= next_peer_check) {
          next_peer_check = options_.clock.now() + options_.peer_check_interval;
          peer_gone = PeerGone(item);
          if (!peer_gone.ok()) return peer_gone;
        }
        return false;
      },
      start + item.timeout, options_.clock, options_.max_poll_sleep);
  // The family's next call may start once this one is enqueued, or once the
  // abort has ended an enqueue that failed (which could finish later).
  if (!enqueued.ok()) {
    Break(item, !peer_gone.ok() ? peer_gone : CallError(item, enqueued.status()));
    PassTurn(item);
    return false;
  }
  if (!*enqueued) {
    Break(item, TimeoutError(item));
    PassTurn(item);
    return false;
  }
  PassTurn(item);
  return true;
}

void CallWorker::Loop() {
  if (options_.on_thread_start) options_.on_thread_start();
  const Clock& clock = options_.clock;
  absl::Time oldest_since;  // When in_flight_.front() became the oldest call.
  absl::Time next_peer_check = absl::InfiniteFuture();  // For the oldest call.
  const bool check_peers = ChecksPeers();
  absl::Duration sleep = absl::Microseconds(1);
  while (true) {
    std::optional<Item> next;
    std::deque<Item> rejected;
    int64_t awaited_turn = -1;  // The next call's ticket, when the family's turn is not yet its.
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (in_flight_.empty()) cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (!broken_.ok()) {
        rejected.swap(queue_);
      } else if (!queue_.empty() && (in_flight_.empty() || !queue_.front().call->NeedsIdle())) {
        const int64_t ticket = queue_.front().ticket;
        if (ticket < 0 || options_.launch_order->IsTurn(ticket)) {
          next = std::move(queue_.front());
          queue_.pop_front();
        } else {
          awaited_turn = ticket;
        }
      }
      if (stop_ && rejected.empty() && !next.has_value() && queue_.empty() && in_flight_.empty()) {
        return;
      }
    }
    if (!rejected.empty()) {
      for (Item& item : rejected) {  // their turns were passed by Break
        item.call.reset();
        item.work->Complete(BrokenError(item.op));
      }
      continue;
    }
    if (next.has_value()) {
      const bool was_idle = in_flight_.empty();
      const absl::Time start = clock.now();
      if (StartItem(*next)) {
        in_flight_.push_back(std::move(*next));
        if (was_idle) {
          oldest_since = start;
          if (check_peers) next_peer_check = start + options_.peer_check_interval;
        }
      }
      sleep = absl::Microseconds(1);
      continue;
    }
    if (in_flight_.empty()) {
      // Only this thread breaks the group or starts its calls: the front stays.
      if (awaited_turn >= 0) options_.launch_order->WaitForTurn(awaited_turn);
      continue;
    }
    Item& oldest = in_flight_.front();
    absl::StatusOr<bool> finished = oldest.call->Finished();
    if (!finished.ok()) {
      Break(oldest, CallError(oldest, finished.status()));
      continue;
    }
    if (*finished) {
      Item done = std::move(oldest);
      in_flight_.pop_front();
      oldest_since = clock.now();
      if (check_peers) next_peer_check = oldest_since + options_.peer_check_interval;
      done.call.reset();
      done.work->Complete(absl::OkStatus());
      sleep = absl::Microseconds(1);
      continue;
    }
    const absl::Time now = clock.now();
    const absl::Time deadline = oldest_since + oldest.timeout;
    if (now >= deadline) {
      Break(oldest, TimeoutError(oldest));
      continue;
    }
    if (now >= next_peer_check) {
      next_peer_check = now + options_.peer_check_interval;
      if (absl::Status gone = PeerGone(oldest); !gone.ok()) {
        Break(oldest, gone);
        continue;
      }
    }
    clock.sleep(std::min(sleep, deadline - now));
    sleep = std::min(2 * sleep, options_.max_poll_sleep);
  }
}

absl::Status CheckNcclTensors(const CollectiveCall& call, tensor::Device device, int rank,
                              int size, absl::string_view label) {
  const std::string head =
      absl::StrCat("[", CollectiveName(call.kind), "] ", Who(rank, size, label), ": ");
  auto check = [&](const tensor::Tensor& t, absl::string_view name) -> absl::Status {
    if (t.device() != device) {
      return absl::InvalidArgumentError(
          absl::StrCat(head, "the ", name, " is on ", t.device().ToString(),
                       "; the nccl group of rank ", rank, " uses ", device.ToString()));
    }
    if (!t.is_contiguous()) {
      return absl::InvalidArgumentError(
          absl::StrCat(head, "the ", name,
                       " is not contiguous (the nccl engine takes contiguous tensors only)"));
    }
    return absl::OkStatus();
  };
  switch (call.kind) {
    case CollectiveKind::kBarrier:
      return absl::OkStatus();
    case CollectiveKind::kAllReduce:
    case CollectiveKind::kBroadcast:
      return check(call.input, "tensor");
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllGather:
      break;
  }
  if (absl::Status s = check(call.input, "input tensor"); !s.ok()) return s;
  if (absl::Status s = check(call.output, "output tensor"); !s.ok()) return s;
  const char* in = static_cast<const char*>(call.input.raw_data());
  const char* out = static_cast<const char*>(call.output.raw_data());
  const int64_t in_bytes = call.input.nbytes();
  const int64_t out_bytes = call.output.nbytes();
  const bool overlap = in_bytes > 0 && out_bytes > 0 && in < out + out_bytes && out < in + in_bytes;
  if (!overlap) return absl::OkStatus();
  if (call.kind == CollectiveKind::kReduceScatter) {
    if (out == in + rank * out_bytes) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(head, "the output overlaps the input but is not chunk ", rank,
                     " of it (the only in-place form NCCL supports)"));
  }
  if (in == out + rank * in_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(head, "the input overlaps the output but is not chunk ", rank,
                   " of it (the only in-place form NCCL supports)"));
}

}  // namespace nccl
}  // namespace dist
