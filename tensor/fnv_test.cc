// FNV-1a 64 against the published test vectors (from the published basis),
// the project's own basis, and continuing a hash.
#include "tensor/fnv.h"

#include <string>

#include "gtest/gtest.h"

namespace tensor {
namespace {

TEST(Fnv1a64Test, MatchesThePublishedVectors) {
  EXPECT_EQ(Fnv1a64("", kFnv1aPublishedBasis), 0xcbf29ce484222325ull);
  EXPECT_EQ(Fnv1a64("a", kFnv1aPublishedBasis), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(Fnv1a64("foobar", kFnv1aPublishedBasis), 0x85944171f73967e8ull);
  // Bytes above 0x7f hash as unsigned whatever char's signedness.
  EXPECT_EQ(Fnv1a64(std::string(1, '\xff')), (kFnv1aBasis ^ 0xffull) * kFnv1aPrime);
}

// The project's basis, which parameter initialization depends on.
TEST(Fnv1a64Test, StartsFromTheProjectsBasis) {
  EXPECT_EQ(Fnv1a64(""), 1469598103934665603ull);
  EXPECT_EQ(Fnv1a64("a"), (1469598103934665603ull ^ 'a') * 1099511628211ull);
}

TEST(Fnv1a64Test, ContinuesFromAGivenValue) {
  EXPECT_EQ(Fnv1a64("bar", Fnv1a64("foo")), Fnv1a64("foobar"));
}

}  // namespace
}  // namespace tensor
