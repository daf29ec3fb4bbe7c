// RedisServer (redis_testing.h): forks redis-server on a free loopback port.
#include "dist/redis_testing.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dist {
namespace testing {
namespace {

sockaddr_in Loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  return addr;
}

// A port nothing listens on now (the kernel's pick for a bind to port 0).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = Loopback(0);
  socklen_t len = sizeof(addr);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  return ok ? ntohs(addr.sin_port) : -1;
}

bool Accepts(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = Loopback(port);
  const bool up = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return up;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RedisServer>> RedisServer::Start() {
  std::string server;
  for (const char* c : {"/usr/bin/redis-server", "/usr/local/bin/redis-server"}) {
    if (access(c, X_OK) == 0) server = c;
  }
  if (server.empty()) return nullptr;
  const int port = FreePort();
  if (port < 0) return absl::UnavailableError("no free loopback port for redis-server");
  const pid_t pid = fork();
  if (pid < 0) return absl::UnavailableError("cannot fork redis-server");
  if (pid == 0) {
    const std::string p = absl::StrCat(port);
    execl(server.c_str(), server.c_str(), "--port", p.c_str(), "--bind", "127.0.0.1", "--save",
          "", "--appendonly", "no", static_cast<char*>(nullptr));
    _exit(127);
  }
  std::unique_ptr<RedisServer> started(new RedisServer(pid, port));
  for (int i = 0; i < 200; ++i) {
    if (Accepts(port)) return started;
    if (waitpid(pid, nullptr, WNOHANG) == pid) {
      started->pid_ = -1;
      return absl::UnavailableError(absl::StrCat(server, " exited before accepting on port ", port));
    }
    usleep(20000);
  }
  return absl::UnavailableError(
      absl::StrCat(server, " did not accept connections on port ", port, " within 4 s"));
}

std::string RedisServer::store() const { return absl::StrCat("redis://127.0.0.1:", port_); }

void RedisServer::Stop() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

RedisServer::~RedisServer() { Stop(); }

}  // namespace testing
}  // namespace dist
