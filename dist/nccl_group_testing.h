// What the nccl engine's test files share: a group's options for a test.
#ifndef DIST_NCCL_GROUP_TESTING_H_
#define DIST_NCCL_GROUP_TESTING_H_

#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "dist/nccl_group.h"

namespace dist {
namespace testing {

// Options under `prefix` with `timeout`, reporting a wait after 2 s.
inline NcclGroupOptions Options(absl::string_view prefix,
                                absl::Duration timeout = absl::Seconds(60)) {
  NcclGroupOptions options;
  options.prefix = std::string(prefix);
  options.timeout = timeout;
  options.report_wait = absl::Seconds(2);
  return options;
}

}  // namespace testing
}  // namespace dist

#endif  // DIST_NCCL_GROUP_TESTING_H_
