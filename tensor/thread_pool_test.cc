// ThreadPool: coverage of the range, concurrent callers, nesting, exceptions.
#include "tensor/thread_pool.h"

#include <atomic>
#include <stdexcept>
#include <vector>

#include "gtest/gtest.h"

namespace tensor {
namespace {

TEST(ThreadPoolTest, CoversEveryIndexOnce) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> hits(10007);
  pool.ParallelFor(hits.size(), 10, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[i]++;
  });
  for (auto& h : hits) ASSERT_EQ(h.load(), 1);
}

TEST(ThreadPoolTest, ConcurrentAndNestedCallers) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&] {
      pool.ParallelFor(100, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          pool.ParallelFor(10, 1, [&](int64_t b2, int64_t e2) { sum += e2 - b2; });
        }
      });
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(sum.load(), 4 * 100 * 10);
}

TEST(ThreadPoolTest, RethrowsTheFirstException) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.ParallelFor(100, 1,
                                [](int64_t b, int64_t) {
                                  if (b == 0) throw std::runtime_error("boom");
                                }),
               std::runtime_error);
  // The pool still works afterwards.
  std::atomic<int> n{0};
  pool.ParallelFor(8, 1, [&](int64_t b, int64_t e) { n += e - b; });
  EXPECT_EQ(n.load(), 8);
}

TEST(ThreadPoolTest, SingleThreadRunsInline) {
  ThreadPool pool(1);
  int calls = 0;
  pool.ParallelFor(50, 1, [&](int64_t b, int64_t e) {
    ++calls;
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 50);
  });
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace tensor
