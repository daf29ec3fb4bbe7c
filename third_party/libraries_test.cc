// Every wrapped Debian library compiles, links and answers a trivial call.
#include <cblas.h>

#include <memory>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "dnnl.hpp"
#include "gloo/config.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/hash_store.h"
#include "glog/logging.h"
#include "gtest/gtest.h"

ABSL_FLAG(int, answer, 42, "a flag, to check absl flags link");

namespace {

TEST(LibrariesTest, Abseil) {
  absl::StatusOr<int> v = absl::GetFlag(FLAGS_answer);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(absl::StrCat("x", *v), "x42");
}

TEST(LibrariesTest, Glog) { LOG(INFO) << "glog links"; }

TEST(LibrariesTest, OneDnnAndOpenBlas) {
  const dnnl_version_t* v = dnnl_version();
  EXPECT_GE(v->major, 2);
  float a = 3, b = 4, c = 0;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, 1, 1, 1.f, &a, 1, &b, 1, 0.f, &c, 1);
  EXPECT_EQ(c, 12.f);
}

TEST(LibrariesTest, GlooStore) {
  gloo::rendezvous::HashStore store;
  store.set("k", std::vector<char>{'v'});
  EXPECT_EQ(store.get("k"), std::vector<char>{'v'});
}

}  // namespace
