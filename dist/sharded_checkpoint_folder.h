// The checkpoint folder on disk, for the sharded checkpoint protocol: durable
// writes, the check that a folder may be replaced (it holds nothing but a
// checkpoint's files, sharded or single-process), and the atomic swap of a finished folder onto
// its name. Private to the sharded_checkpoint library and to the
// single-process save (models/common:train_support), which replaces step
// folders under the same check.
#ifndef DIST_SHARDED_CHECKPOINT_FOLDER_H_
#define DIST_SHARDED_CHECKPOINT_FOLDER_H_

#include <string>

#include "absl/status/status.h"

namespace dist::sharded {

// Unavailable "<what> '<path>': <strerror(errno)>".
absl::Status ErrnoStatus(const std::string& what, const std::string& path);

// OK when `dir` does not exist, or is a folder that holds nothing but a
// checkpoint's files, sharded or single-process (so replacing it loses
// nothing else).
absl::Status CheckReplaceable(const std::string& dir);

// Removes `path` and everything below it; errors are ignored.
void RemoveTree(const std::string& path);

// CheckReplaceable(dir), then moves the finished folder `tmp` onto `dir`
// (tensor::ReplaceFolderDurably: replacing a previous checkpoint atomically
// when the filesystem supports RENAME_EXCHANGE).
absl::Status Publish(const std::string& tmp, const std::string& dir, const std::string& id);

// `s` without trailing '/' (but "/" stays "/").
std::string StripTrailingSlashes(std::string s);

}  // namespace dist::sharded

#endif  // DIST_SHARDED_CHECKPOINT_FOLDER_H_
