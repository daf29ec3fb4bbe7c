// Redis rendezvous stores ("redis://host:port", gloo's RedisStore): the
// endpoint a store names, and removing a finished run's keys.
#ifndef DIST_REDIS_KEYS_H_
#define DIST_REDIS_KEYS_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace dist {

// "redis://host[:port]" (port 6379 by default) as host and port; an IPv6
// address in brackets, "redis://[::1]:6379" (the host is then "::1"; a zone
// "%25eth0" is "%eth0").
// InvalidArgument naming the store and what is wrong otherwise: no host, a
// port that is not 1..65535 in digits, an IPv6 address without brackets (or
// brackets around anything else), credentials
// ("user:password@": gloo's RedisStore does not authenticate), or a
// database or options after the endpoint ("/1", "?...").
absl::StatusOr<std::pair<std::string, int>> ParseRedisStore(const std::string& store);

// Once every rank of a run is done with the store (a barrier after the run;
// a gloo group reads it only to connect and split): removes the keys under
// "<prefix>/" from the "redis://host:port" `store` (SCAN MATCH, DEL), so
// that a Redis server that many jobs share does not keep every run's. Returns
// how many were removed. InvalidArgument for a store that is not Redis;
// Unavailable naming the store when it cannot be reached or refuses.
absl::StatusOr<int64_t> RemoveRedisKeys(const std::string& store, const std::string& prefix);

}  // namespace dist

#endif  // DIST_REDIS_KEYS_H_
