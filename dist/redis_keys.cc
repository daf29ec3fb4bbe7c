// Redis rendezvous stores; see redis_keys.h.
#include "dist/redis_keys.h"

#include <hiredis.h>
#include <sys/time.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"

namespace dist {

absl::StatusOr<std::pair<std::string, int>> ParseRedisStore(const std::string& store) {
  auto bad = [&store](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("store \"", store, "\" ", why));
  };
  absl::string_view rest = store;
  if (!absl::ConsumePrefix(&rest, "redis://")) return bad("is not redis://host:port");
  if (absl::StrContains(rest, '@')) {
    return bad("holds credentials (user:password@): gloo's RedisStore does not authenticate; "
               "give a server the ranks reach without AUTH");
  }
  if (absl::StrContains(rest, '/') || absl::StrContains(rest, '?')) {
    return bad("names a database or options after the endpoint: give redis://host:port only "
               "(the keys go to database 0)");
  }
  std::string host(rest);
  std::optional<absl::string_view> port_text;  // after ':', when there is one
  if (absl::ConsumePrefix(&rest, "[")) {  // an IPv6 address: [addr] or [addr]:port
    const size_t close = rest.find(']');
    if (close == absl::string_view::npos) {
      return bad("opens '[' without a ']' (an IPv6 address is redis://[addr]:port)");
    }
    // RFC 6874 writes a zone "%25eth0"; getaddrinfo takes "%eth0".
    host = absl::StrReplaceAll(rest.substr(0, close), {{"%25", "%"}});
    if (!host.empty() && !absl::StrContains(host, ':')) {
      return bad("holds a host in brackets that is not an IPv6 address: brackets are for IPv6 "
                 "(redis://[::1]:6379); write a name or IPv4 address without them");
    }
    rest.remove_prefix(close + 1);
    if (!rest.empty()) {
      if (!absl::ConsumePrefix(&rest, ":")) return bad("has text after ']' that is not :port");
      port_text = rest;
    }
  } else {
    const size_t colon = rest.find(':');
    if (colon != absl::string_view::npos) {
      if (rest.find(':', colon + 1) != absl::string_view::npos) {
        return bad("holds an IPv6 address without brackets: write redis://[addr]:port");
      }
      host = std::string(rest.substr(0, colon));
      port_text = rest.substr(colon + 1);
    }
  }
  if (host.empty()) return bad("names no host");
  int port = 6379;
  if (port_text && (port_text->empty() || port_text->size() > 5 ||
                    !std::all_of(port_text->begin(), port_text->end(), absl::ascii_isdigit) ||
                    !absl::SimpleAtoi(*port_text, &port) || port < 1 || port > 65535)) {
    return bad(absl::StrCat("has port '", *port_text, "': a number in 1..65535"));
  }
  return std::pair{host, port};
}

namespace {

// `text` with Redis glob's special characters escaped (a MATCH pattern that
// means exactly it).
std::string GlobLiteral(absl::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\' || c == '^' || c == '-') {
      out += '\\';
    }
    out += c;
  }
  return out;
}

}  // namespace

absl::StatusOr<int64_t> RemoveRedisKeys(const std::string& store, const std::string& prefix) {
  absl::StatusOr<std::pair<std::string, int>> endpoint = ParseRedisStore(store);
  if (!endpoint.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("[gloo] ", endpoint.status().message()));
  }
  const timeval timeout{5, 0};
  std::unique_ptr<redisContext, void (*)(redisContext*)> redis(
      redisConnectWithTimeout(endpoint->first.c_str(), endpoint->second, timeout), redisFree);
  if (redis == nullptr || redis->err != 0) {
    return absl::UnavailableError(absl::StrCat(
        "[gloo] removing the keys under ", prefix, "/ from ", store, ": cannot connect: ",
        redis == nullptr ? "out of memory" : redis->errstr));
  }
  redisSetTimeout(redis.get(), timeout);
  using Reply = std::unique_ptr<redisReply, void (*)(void*)>;
  auto command = [&](const std::vector<std::string>& args) -> absl::StatusOr<Reply> {
    std::vector<const char*> argv;
    std::vector<size_t> lengths;
    for (const std::string& a : args) {
      argv.push_back(a.data());
      lengths.push_back(a.size());
    }
    Reply reply(static_cast<redisReply*>(redisCommandArgv(
                    redis.get(), static_cast<int>(argv.size()), argv.data(), lengths.data())),
                freeReplyObject);
    if (reply == nullptr || reply->type == REDIS_REPLY_ERROR) {
      return absl::UnavailableError(absl::StrCat(
          "[gloo] removing the keys under ", prefix, "/ from ", store, ": ", args[0], ": ",
          reply == nullptr ? redis->errstr : std::string(reply->str, reply->len)));
    }
    return reply;
  };
  const std::string pattern = GlobLiteral(prefix) + "/*";
  int64_t removed = 0;
  std::string cursor = "0";
  do {  // SCAN visits every key present throughout, some maybe twice: DEL counts each once
    absl::StatusOr<Reply> page = command({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"});
    if (!page.ok()) return page.status();
    const redisReply& r = **page;
    if (r.type != REDIS_REPLY_ARRAY || r.elements != 2 ||
        r.element[0]->type != REDIS_REPLY_STRING || r.element[1]->type != REDIS_REPLY_ARRAY) {
      return absl::UnavailableError(absl::StrCat("[gloo] removing the keys under ", prefix,
                                                 "/ from ", store, ": SCAN: an unexpected reply"));
    }
    cursor.assign(r.element[0]->str, r.element[0]->len);
    std::vector<std::string> del = {"DEL"};
    for (size_t i = 0; i < r.element[1]->elements; ++i) {
      const redisReply* key = r.element[1]->element[i];
      del.emplace_back(key->str, key->len);
    }
    if (del.size() > 1) {
      absl::StatusOr<Reply> deleted = command(del);
      if (!deleted.ok()) return deleted.status();
      if ((*deleted)->type == REDIS_REPLY_INTEGER) removed += (*deleted)->integer;
    }
  } while (cursor != "0");
  return removed;
}

}  // namespace dist
