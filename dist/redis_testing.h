// A redis-server of a test's own on 127.0.0.1 (a free port, nothing saved),
// stopped when the object goes; absent when redis-server is not installed,
// so that a test can skip. Test-only.
#ifndef DIST_REDIS_TESTING_H_
#define DIST_REDIS_TESTING_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace dist {
namespace testing {

class RedisServer {
 public:
  // Starts one and waits (up to 4 s) until it accepts connections. Returns
  // nullptr when no redis-server is installed; an error when it is but did
  // not come up.
  static absl::StatusOr<std::unique_ptr<RedisServer>> Start();
  ~RedisServer();  // SIGTERM, then waits for it
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  // "redis://127.0.0.1:<port>", a store for the gloo engine and RemoveRedisKeys.
  std::string store() const;
  // Stops it now (SIGTERM, then waits): a server that is gone.
  void Stop();

 private:
  RedisServer(pid_t pid, int port) : pid_(pid), port_(port) {}
  pid_t pid_;
  int port_;
};

}  // namespace testing
}  // namespace dist

#endif  // DIST_REDIS_TESTING_H_
