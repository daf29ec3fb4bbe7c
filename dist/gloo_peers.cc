// Who a gloo group's peers are (gloo_peers.h).
#include "dist/gloo_peers.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dist/host_name.h"
#include "dist/proc_stat.h"
#include "dist/rank_names.h"
#include "tensor/fnv.h"

namespace dist {
namespace internal {
namespace {

// FNV-1a of the host name: the same on every rank whatever its build.
uint64_t HostHash(const std::string& name) {
  if (name.empty()) return 0;
  const uint64_t h = tensor::Fnv1a64(name);
  return h == 0 ? 1 : h;
}

// `from` into the `n` bytes at `to`, NUL-padded and truncated to n - 1.
void CopyTruncated(const std::string& from, char* to, size_t n) {
  std::memset(to, 0, n);
  std::memcpy(to, from.data(), std::min(from.size(), n - 1));
}

// The text CopyTruncated wrote into the `n` bytes at `bytes`.
std::string TextOf(const char* bytes, size_t n) { return std::string(bytes, strnlen(bytes, n)); }

}  // namespace

PeerProcess ThisProcess() {
  PeerProcess me;
  const std::string name = HostName();
  me.host = HostHash(name);
  me.pid = static_cast<int64_t>(::getpid());
  CopyTruncated(name, me.host_name, sizeof(me.host_name));
  return me;
}

void AddressBytes(const std::string& address, char* out) {
  CopyTruncated(address.substr(0, address.find('$')), out, kAddressBytes);
}

std::string AddressOf(const char* bytes) { return TextOf(bytes, kAddressBytes); }

std::string ExitedPeers(const std::vector<PeerProcess>& peers, const std::vector<int>& among,
                        int wait_ms, const std::vector<int>& world_ranks) {
  const uint64_t host = HostHash(HostName());
  std::vector<int> here;  // the ranks of `among` on this host
  for (const int r : among) {
    if (r >= 0 && r < static_cast<int>(peers.size()) && peers[r].host != 0 &&
        peers[r].host == host) {
      here.push_back(r);
    }
  }
  if (here.empty()) return "";
  for (int waited = 0;; waited += 100) {
    std::vector<std::string> exited;
    for (const int r : here) {
      if (!ProcessExited(peers[r].pid)) continue;
      exited.push_back(absl::StrCat(NameRanks({r}, world_ranks), " exited (pid ", peers[r].pid,
                                    " on this host)"));
    }
    if (!exited.empty()) return absl::StrJoin(exited, ", ");
    if (waited >= wait_ms) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

namespace {

// True when `text` holds `address`: "[10.0.0.2]:4123" is not in
// "[10.0.0.2]:41235" (the port ends the text or a non-digit follows it).
bool Holds(const std::string& text, const std::string& address) {
  for (size_t at = text.find(address); !address.empty() && at != std::string::npos;
       at = text.find(address, at + 1)) {
    const size_t end = at + address.size();
    if (end == text.size() || !std::isdigit(static_cast<unsigned char>(text[end]))) return true;
  }
  return false;
}

}  // namespace

int PeerIndexNamedIn(const std::string& gloo_error,
                     const std::vector<std::vector<std::string>>& addresses, int rank) {
  int named = -1;
  for (int r = 0; r < static_cast<int>(addresses.size()); ++r) {
    if (r == rank) continue;
    for (const std::string& address : addresses[r]) {
      if (!Holds(gloo_error, address)) continue;
      if (named >= 0) return -1;  // two peers: gloo's text is not about one
      named = r;
      break;
    }
  }
  return named;
}

std::string PeerNamedIn(const std::string& gloo_error, const std::vector<PeerProcess>& peers,
                        const std::vector<std::vector<std::string>>& addresses, int rank,
                        const std::vector<int>& world_ranks) {
  const int named = PeerIndexNamedIn(gloo_error, addresses, rank);
  if (named < 0 || named >= static_cast<int>(peers.size())) return "";
  std::string address;
  for (const std::string& a : addresses[named]) {
    if (Holds(gloo_error, a)) address = a;
  }
  const PeerProcess& p = peers[named];
  const std::string host_name = TextOf(p.host_name, sizeof(p.host_name));
  const std::string who = absl::StrCat(NameRanks({named}, world_ranks), " (on ",
                                       host_name.empty() ? "an unnamed host" : host_name, ", ",
                                       address, ")");
  if (p.host != 0 && p.host == HostHash(HostName())) {
    if (ProcessExited(p.pid)) return absl::StrCat(who, ": its process (pid ", p.pid, ") is gone");
    return absl::StrCat(who, ": its connection closed while its process (pid ", p.pid,
                        ") still runs: it left the group (e.g. after an error of its own)");
  }
  return absl::StrCat(who, ": its process or its host stopped, or the network to it failed");
}

}  // namespace internal
}  // namespace dist
