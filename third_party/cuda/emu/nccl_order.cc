// The emulated NCCL's model of launch order across communicators
// (nccl_model.h). NCCL kernels of communicators that share a GPU may run one
// at a time, in launch order, and each waits for its peers: a program must
// launch them in the same order on every rank, or they can deadlock. The
// emulation runs them so: a call whose ranks all came still waits, on each
// of its ranks' devices, for the unfinished calls of other communicators
// launched there before it. Two kinds of misordering fail the communicators
// involved with ncclInvalidUsage, naming the devices:
//   - two unfinished calls launched in opposite orders on two devices, seen
//     as soon as the second device launches one of them (CheckPair);
//   - a cycle of calls each waiting for the next, through three or more
//     devices (HYBRID_SHARD's shard and replica groups share one device
//     pairwise), seen when the launch that closes it comes: a call waits for
//     the calls launched before it on its devices, and, on the device of a
//     rank that has not launched it yet, for every call launched there
//     already (it will come after them).
#include <algorithm>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "third_party/cuda/emu/nccl_model.h"

namespace cuda_emu_nccl {
namespace {

// A collective launched on a device and not finished.
struct Launch {
  const Clique* clique = nullptr;
  int64_t number = 0;
  bool operator==(const Launch& o) const { return clique == o.clique && number == o.number; }
  bool operator<(const Launch& o) const {
    if (clique != o.clique) return std::less<const Clique*>()(clique, o.clique);
    return number < o.number;
  }
};

// By device, in launch order.
std::map<int, std::vector<Launch>>& Launches() {
  static auto* launches = new std::map<int, std::vector<Launch>>;
  return *launches;
}

// The rank of `clique` on `device`, or -1.
int RankOn(const Clique& clique, int device) {
  for (int r = 0; r < clique.size; ++r) {
    if (clique.members[r] != nullptr && clique.members[r]->device == device) return r;
  }
  return -1;
}

// Whether call `number` of `clique` is unfinished and its rank on `device`
// has not launched it.
bool NotYetLaunchedOn(const Clique& clique, int64_t number, int device) {
  const auto it = clique.calls.find(number);
  if (it == clique.calls.end()) return false;
  const int r = RankOn(clique, device);
  return r >= 0 && it->second.parts[r].work == nullptr;
}

// Fails every communicator of `cliques` with `message` and forgets their
// launches: failed communicators launch nothing more, and their launches so
// far must not blame communicators made later on these devices.
void FailAll(const std::vector<const Clique*>& cliques, const std::string& message) {
  for (const Clique* c : cliques) {
    for (ncclComm_t m : c->members) SetError(m, ncclInvalidUsage, message);
  }
  for (const Clique* c : cliques) ForgetLaunches(c, -1, -1);
}

// The launch of call `number` of `comm`'s clique on comm's device against
// the launches of other communicators: fails both communicators when another
// device launched the two calls in the other order; true then.
bool CheckPair(ncclComm_t comm, const Call& call, int64_t number) {
  const Clique& clique = *comm->clique;
  const int device = comm->device;
  // `y_first` launched call #other_number of `other` before this call,
  // `x_first` this call first.
  auto fail = [&](const Clique& other, int64_t other_number, int y_first, int x_first) {
    FailAll({&clique, &other},
            "emulated NCCL: communicators sharing devices launched in different orders: cuda:" +
                std::to_string(y_first) + " launched call #" + std::to_string(other_number) +
                " of one before call #" + std::to_string(number) + " of another, cuda:" +
                std::to_string(x_first) +
                " the other way round (NCCL kernels can then deadlock: launch them in the same "
                "order on every rank)");
    return true;
  };
  // An earlier unfinished launch Y on this device, which a peer's device
  // that already launched this call has not launched yet.
  for (const Launch& y : Launches()[device]) {
    if (y.clique == &clique) continue;
    for (int r = 0; r < clique.size; ++r) {
      if (r == comm->rank || call.parts[r].work == nullptr) continue;
      const int other_device = clique.members[r] == nullptr ? -1 : clique.members[r]->device;
      if (other_device >= 0 && NotYetLaunchedOn(*y.clique, y.number, other_device)) {
        return fail(*y.clique, y.number, device, other_device);
      }
    }
  }
  // A peer's device that launched this call after a call Y that this device
  // has not launched yet.
  for (int r = 0; r < clique.size; ++r) {
    if (r == comm->rank || call.parts[r].work == nullptr || clique.members[r] == nullptr) continue;
    const int other_device = clique.members[r]->device;
    for (const Launch& y : Launches()[other_device]) {
      if (y.clique == &clique && y.number == number) break;  // launches after this call's
      if (y.clique != &clique && NotYetLaunchedOn(*y.clique, y.number, device)) {
        return fail(*y.clique, y.number, other_device, device);
      }
    }
  }
  return false;
}

// "the group on cuda:0 and cuda:2": a communicator, by its ranks' devices.
std::string GroupName(const Clique& clique) {
  std::string name = "the group on";
  for (int r = 0; r < clique.size; ++r) {
    if (r > 0) name += r + 1 == clique.size ? " and" : ",";
    const ncclComm_t m = clique.members[r];
    name += m == nullptr ? " a departed rank" : " cuda:" + std::to_string(m->device);
  }
  return name;
}

// The calls `x` waits for, each with the device it waits on: on each of its
// ranks' devices, the unfinished calls of other communicators launched there
// before it, or, where its rank has not launched it yet, all of them.
std::vector<std::pair<Launch, int>> WaitsFor(const Launch& x) {
  std::vector<std::pair<Launch, int>> out;
  const auto call = x.clique->calls.find(x.number);
  if (call == x.clique->calls.end()) return out;
  for (int r = 0; r < x.clique->size; ++r) {
    const ncclComm_t m = x.clique->members[r];
    if (m == nullptr) continue;
    const auto list = Launches().find(m->device);
    if (list == Launches().end()) continue;
    const bool launched = call->second.parts[r].work != nullptr;
    const auto end = launched ? std::find(list->second.begin(), list->second.end(), x)
                              : list->second.end();
    for (auto y = list->second.begin(); y != end; ++y) {
      if (y->clique != x.clique) out.push_back({*y, m->device});
    }
  }
  return out;
}

// Whether some unfinished call waits for `x` (WaitsFor): without one, no
// cycle passes through it.
bool Awaited(const Launch& x) {
  for (const auto& [device, list] : Launches()) {
    for (const Launch& y : list) {
      if (y.clique == x.clique) continue;
      for (const auto& [z, on] : WaitsFor(y)) {
        if (z == x) return true;
      }
    }
  }
  return false;
}

}  // namespace

void ForgetLaunches(const Clique* clique, int64_t number, int device) {
  for (auto& [d, list] : Launches()) {
    if (device >= 0 && d != device) continue;
    list.erase(std::remove_if(list.begin(), list.end(),
                              [&](const Launch& l) {
                                return l.clique == clique && (number < 0 || l.number == number);
                              }),
               list.end());
  }
}

bool RecordLaunch(ncclComm_t comm, const Call& call, int64_t number) {
  if (CheckPair(comm, call, number)) return false;
  Launches()[comm->device].push_back(Launch{comm->clique.get(), number});
  return true;
}

bool Blocked(const Clique& clique, int64_t number) {
  return !WaitsFor(Launch{&clique, number}).empty();
}

bool FailDeadlock(const Clique& clique, int64_t number) {
  // Depth-first from the call along "waits for"; a path back to it is a
  // cycle: every call on it waits for the next, none can finish.
  const Launch start{&clique, number};
  if (!Awaited(start)) return false;
  std::vector<std::pair<Launch, int>> path;  // the calls after `start`, each with its device
  std::set<Launch> seen;
  std::function<bool(const Launch&)> visit = [&](const Launch& x) -> bool {
    for (const auto& [y, device] : WaitsFor(x)) {
      path.push_back({y, device});
      if (y == start) return true;
      if (seen.insert(y).second && visit(y)) return true;
      path.pop_back();
    }
    return false;
  };
  if (!visit(start)) return false;
  std::string message =
      "emulated NCCL: communicators sharing devices launched in different orders, in a cycle "
      "of calls each waiting for the next:";
  std::vector<const Clique*> cliques = {&clique};
  Launch from = start;
  for (const auto& [y, device] : path) {
    message += std::string(from == start ? " " : "; ") + "cuda:" + std::to_string(device) +
               " has call #" + std::to_string(y.number) + " of " + GroupName(*y.clique) +
               " before call #" + std::to_string(from.number) + " of " +
               GroupName(*from.clique);
    if (std::find(cliques.begin(), cliques.end(), y.clique) == cliques.end()) {
      cliques.push_back(y.clique);
    }
    from = y;
  }
  message += " (NCCL kernels deadlock so: launch them in the same order on every rank)";
  FailAll(cliques, message);
  return true;
}

void CompleteUnblocked() {
  bool progress = true;
  while (progress) {
    progress = false;
    for (const auto& [device, list] : Launches()) {
      for (const Launch& l : list) {
        auto* clique = const_cast<Clique*>(l.clique);  // the calls are the emulation's own
        const auto it = clique->calls.find(l.number);
        if (it == clique->calls.end() || it->second.arrived < clique->size) continue;
        if (Blocked(*clique, l.number)) continue;
        CompleteCall(*clique, l.number);  // changes the lists: start over
        progress = true;
        break;
      }
      if (progress) break;
    }
  }
}

}  // namespace cuda_emu_nccl
