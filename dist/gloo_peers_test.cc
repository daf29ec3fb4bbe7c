// Naming the peer a gloo error is about: this process as it announces
// itself, the addresses exchanged as bytes, and the peer one of whose
// addresses gloo's message holds, on another host or on this one (its
// process alive or gone).
#include "dist/gloo_peers.h"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "dist/host_name.h"
#include "gtest/gtest.h"

namespace dist {
namespace internal {
namespace {

PeerProcess Peer(uint64_t host, int64_t pid, const std::string& host_name) {
  PeerProcess p;
  p.host = host;
  p.pid = pid;
  std::strncpy(p.host_name, host_name.c_str(), sizeof(p.host_name) - 1);
  return p;
}

TEST(GlooPeersTest, ThisProcessAnnouncesItsHostAndPid) {
  const PeerProcess me = ThisProcess();
  EXPECT_EQ(me.pid, ::getpid());
  EXPECT_EQ(std::string(me.host_name), HostName().substr(0, sizeof(me.host_name) - 1));
  EXPECT_NE(me.host, 0u);
}

TEST(GlooPeersTest, AConnectionEndGoesAsBytesWithoutGloosSequenceNumber) {
  std::vector<char> bytes(kAddressBytes, 'x');
  AddressBytes("[127.0.0.1]:41235$3", bytes.data());
  EXPECT_EQ(AddressOf(bytes.data()), "[127.0.0.1]:41235");
  const std::string v6 = "[fe80:0000:0000:0000:0202:b3ff:fe1e:8329]:65535";
  AddressBytes(v6, bytes.data());
  EXPECT_EQ(AddressOf(bytes.data()), v6);
  AddressBytes(std::string(100, 'y'), bytes.data());  // truncated, still terminated
  EXPECT_EQ(AddressOf(bytes.data()), std::string(kAddressBytes - 1, 'y'));
}

TEST(GlooPeersTest, ThePeerWhoseAddressGlooNamesOnAnotherHost) {
  const uint64_t here = ThisProcess().host;
  const uint64_t there = here + 1;
  const std::vector<PeerProcess> peers = {
      Peer(here, ::getpid(), "node-1"),
      Peer(there, 4242, "node-2"),
      Peer(there, 4243, "node-2"),
      Peer(there, 4244, ""),
  };
  const std::vector<std::vector<std::string>> ends = {
      {}, {"[10.0.0.2]:41235"}, {"[10.0.0.2]:4123", "[10.0.0.2]:6000"}, {"[10.0.0.3]:5000"}};
  EXPECT_EQ(PeerNamedIn("[pair.cc:598] Connection closed by peer [10.0.0.2]:41235", peers, ends, 0),
            "rank 1 (on node-2, [10.0.0.2]:41235): its process or its host stopped, or the "
            "network to it failed");
  // A port that begins another's is not that other's.
  EXPECT_EQ(PeerNamedIn("Read error [10.0.0.2]:4123: Connection reset by peer", peers, ends, 0),
            "rank 2 (on node-2, [10.0.0.2]:4123): its process or its host stopped, or the "
            "network to it failed");
  EXPECT_EQ(PeerNamedIn("Connection closed by peer [10.0.0.3]:5000", peers, ends, 0),
            "rank 3 (on an unnamed host, [10.0.0.3]:5000): its process or its host stopped, or "
            "the network to it failed");
  // Either of a peer's addresses names it (its end of the connection, or
  // where it listened), and the message shows the one gloo's text holds.
  EXPECT_EQ(PeerNamedIn("Connection closed by peer [10.0.0.2]:6000", peers, ends, 0),
            "rank 2 (on node-2, [10.0.0.2]:6000): its process or its host stopped, or the "
            "network to it failed");
  // No peer's end, or two peers': nothing to name.
  EXPECT_EQ(PeerNamedIn("Timed out waiting 5000ms for recv operation to complete", peers, ends, 0),
            "");
  EXPECT_EQ(PeerNamedIn("[10.0.0.2]:41235 and [10.0.0.3]:5000", peers, ends, 0), "");
  // Two peers on one host whose ends share a port (each connects to another
  // of this rank's sockets): either may be the one, so neither is named.
  const std::vector<std::vector<std::string>> shared = {
      {}, {"[10.0.0.2]:5000"}, {"[10.0.0.2]:5000"}, {}};
  EXPECT_EQ(PeerNamedIn("Connection closed by peer [10.0.0.2]:5000", peers, shared, 0), "");
  // In a subgroup, with the peer's rank in the world group.
  EXPECT_EQ(PeerNamedIn("Connection closed by peer [10.0.0.3]:5000", peers, ends, 0, {1, 3, 5, 7}),
            "rank 3 (world 7) (on an unnamed host, [10.0.0.3]:5000): its process or its host "
            "stopped, or the network to it failed");
}

TEST(GlooPeersTest, APeerOnThisHostSaysWhetherItsProcessRuns) {
  const uint64_t here = ThisProcess().host;
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);  // reaped: its pid names no process now
  const std::vector<PeerProcess> peers = {
      Peer(here, 1, "me"),
      Peer(here, ::getpid(), "me"),
      Peer(here, child, "me"),
  };
  const std::vector<std::vector<std::string>> ends = {
      {}, {"[127.0.0.1]:4001", "[127.0.0.1]:5001"}, {"[127.0.0.1]:5002"}};
  EXPECT_EQ(PeerNamedIn("Connection closed by peer [127.0.0.1]:5001", peers, ends, 0),
            "rank 1 (on me, [127.0.0.1]:5001): its connection closed while its process (pid " +
                std::to_string(::getpid()) +
                ") still runs: it left the group (e.g. after an error of its own)");
  EXPECT_EQ(PeerNamedIn("Connection closed by peer [127.0.0.1]:5002", peers, ends, 0),
            "rank 2 (on me, [127.0.0.1]:5002): its process (pid " + std::to_string(child) +
                ") is gone");
  EXPECT_EQ(ExitedPeers(peers, {1, 2}, /*wait_ms=*/0),
            "rank 2 exited (pid " + std::to_string(child) + " on this host)");
  EXPECT_EQ(ExitedPeers({peers[0], peers[1]}, {1}, /*wait_ms=*/0), "");
  // Only the peers asked about: rank 2 exited, but the error was rank 1's.
  EXPECT_EQ(ExitedPeers(peers, {1}, /*wait_ms=*/0), "");
  EXPECT_EQ(ExitedPeers(peers, {2}, /*wait_ms=*/0),
            "rank 2 exited (pid " + std::to_string(child) + " on this host)");
  // A peer on another host is not waited for: it cannot be seen to exit.
  const std::vector<PeerProcess> away = {peers[0], Peer(here + 1, 4242, "node-2")};
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(ExitedPeers(away, {1}, /*wait_ms=*/5000), "");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
  EXPECT_EQ(PeerIndexNamedIn("Connection closed by peer [127.0.0.1]:5001", ends, 0), 1);
  EXPECT_EQ(PeerIndexNamedIn("Connection closed by peer [127.0.0.1]:5003", ends, 0), -1);
}

}  // namespace
}  // namespace internal
}  // namespace dist
