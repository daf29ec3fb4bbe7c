// Who a gloo group's peers are, for naming the one that was lost: each rank
// announces its host and pid when the group connects (all-gathered as
// PeerProcess) and sends every peer the two addresses that peer's gloo
// errors may print for it: its end of their connection, and where it
// listened for that peer (gloo's TCP pairs each have a socket of their own:
// a rank has no one address). A failed collective's error then names the
// peer whose address gloo's message holds ("Connection closed by peer
// [10.0.0.2]:41235"), with its host and whether its process still runs, or
// else the peers whose process exited on this host.
#ifndef DIST_GLOO_PEERS_H_
#define DIST_GLOO_PEERS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace dist {
namespace internal {

// One rank as it announced itself; plain bytes, all-gathered as they are.
// The host name is NUL-padded and truncated to fit.
struct PeerProcess {
  uint64_t host = 0;        // FNV-1a of the host name: equal on one host (0: unknown)
  int64_t pid = 0;
  char host_name[64] = {};  // gethostname()
};
static_assert(sizeof(PeerProcess) == 80, "all-gathered as 80 bytes a rank");

// This process: this host's and its pid.
PeerProcess ThisProcess();

// The bytes an address takes in the exchange of addresses (AddressBytes):
// "[<IPv6>]:<port>" fits.
inline constexpr size_t kAddressBytes = 64;
// `address` (a gloo pair's transport::Address::str(); a "$<sequence>" suffix
// dropped) NUL-padded into kAddressBytes at `out`, truncated to fit.
void AddressBytes(const std::string& address, char* out);
// The address AddressBytes wrote at `bytes`.
std::string AddressOf(const char* bytes);

// The peers among `among` (ranks) on this host whose process has exited:
// "rank 2 exited (pid 4242 on this host)" (named by NameRanks, rank_names.h,
// with `world_ranks`); "" when none
// did. A peer's sockets close as its process exits, a moment before the
// process is gone: looked for for up to `wait_ms` (not at all when none of
// them is on this host).
std::string ExitedPeers(const std::vector<PeerProcess>& peers, const std::vector<int>& among,
                        int wait_ms, const std::vector<int>& world_ranks = {});

// The one peer (not `rank`) one of whose addresses, `addresses[r]` (what
// this rank's gloo errors may print for it; none for this rank), gloo's
// error text holds; -1 when none does, or more than one (two peers'
// addresses may share a port).
int PeerIndexNamedIn(const std::string& gloo_error,
                     const std::vector<std::vector<std::string>>& addresses, int rank);

// The one peer (not `rank`) whose address gloo's error text names, as "rank
// 2 (on node-3, [10.0.0.2]:41235)" followed by what is known of it: on this
// host, that its process (pid) still runs (it closed the group, e.g. after
// an error of its own) or is gone; on another host, that it or its host
// stopped or the network between failed. "" when PeerIndexNamedIn names
// none. The peer is named by NameRanks (rank_names.h) with `world_ranks`.
std::string PeerNamedIn(const std::string& gloo_error, const std::vector<PeerProcess>& peers,
                        const std::vector<std::vector<std::string>>& addresses, int rank,
                        const std::vector<int>& world_ranks = {});

}  // namespace internal
}  // namespace dist

#endif  // DIST_GLOO_PEERS_H_
