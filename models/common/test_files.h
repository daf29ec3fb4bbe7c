// Files of the tests that write model folders (the Hugging Face readers'
// tests of minGPT and T5).
#ifndef MODELS_COMMON_TEST_FILES_H_
#define MODELS_COMMON_TEST_FILES_H_

#include <string>

namespace train {
namespace testing {

// An empty folder `name` under the test's temporary directory (removed and
// made again): its path.
std::string FreshTempDir(const std::string& name);

// Writes `text` to `path` (replacing it).
void WriteFile(const std::string& path, const std::string& text);

}  // namespace testing
}  // namespace train

#endif  // MODELS_COMMON_TEST_FILES_H_
