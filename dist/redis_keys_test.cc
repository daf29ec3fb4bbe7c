// The endpoint of a "redis://" rendezvous store: host names, IPv4 and
// bracketed IPv6 addresses, the default port, and what is refused by name.
// (RemoveRedisKeys against a live server: gloo_group_test's Redis case.)
#include "dist/redis_keys.h"

#include <string>
#include <utility>

#include "gtest/gtest.h"

namespace dist {
namespace {

using Endpoint = std::pair<std::string, int>;

TEST(ParseRedisStoreTest, HostAndPort) {
  EXPECT_EQ(ParseRedisStore("redis://10.0.0.1:6380").value(), Endpoint("10.0.0.1", 6380));
  EXPECT_EQ(ParseRedisStore("redis://head-node").value(), Endpoint("head-node", 6379));
  EXPECT_EQ(ParseRedisStore("redis://[::1]:7000").value(), Endpoint("::1", 7000));
  EXPECT_EQ(ParseRedisStore("redis://[fe80::1%eth0]").value(), Endpoint("fe80::1%eth0", 6379));
  EXPECT_EQ(ParseRedisStore("redis://[fe80::1%25eth0]:1").value(), Endpoint("fe80::1%eth0", 1));
}

TEST(ParseRedisStoreTest, WhatIsWrongIsNamed) {
  const std::pair<std::string, std::string> cases[] = {
      {"/tmp/store", "is not redis://host:port"},
      {"redis://", "names no host"},
      {"redis://:6379", "names no host"},
      {"redis://[]:6379", "names no host"},
      {"redis://host:0", "has port '0': a number in 1..65535"},
      {"redis://host:65536", "has port '65536': a number in 1..65535"},
      {"redis://host:", "has port '': a number in 1..65535"},
      {"redis://host:+6379", "has port '+6379': a number in 1..65535"},
      {"redis://host: 6379", "has port ' 6379': a number in 1..65535"},
      {"redis://host:0006379", "has port '0006379': a number in 1..65535"},
      {"redis://[head-node]:6379",
       "holds a host in brackets that is not an IPv6 address: brackets are for IPv6 "
       "(redis://[::1]:6379); write a name or IPv4 address without them"},
      {"redis://::1:6379", "holds an IPv6 address without brackets: write redis://[addr]:port"},
      {"redis://[::1:6379", "opens '[' without a ']' (an IPv6 address is redis://[addr]:port)"},
      {"redis://[::1]6379", "has text after ']' that is not :port"},
      {"redis://user:secret@host:6379",
       "holds credentials (user:password@): gloo's RedisStore does not authenticate; give a "
       "server the ranks reach without AUTH"},
      {"redis://host:6379/1",
       "names a database or options after the endpoint: give redis://host:port only (the keys "
       "go to database 0)"},
  };
  for (const auto& [store, why] : cases) {
    const absl::StatusOr<Endpoint> e = ParseRedisStore(store);
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << store;
    EXPECT_EQ(e.status().message(), "store \"" + store + "\" " + why);
  }
}

}  // namespace
}  // namespace dist
