// The CPU caching allocator: large freed blocks are reused, the cap holds, the
// memory ledger stays exact, ReleaseCachedMemory gives memory back to the
// system, and concurrent use is safe (also run under --config=tsan).
#include "tensor/cpu_allocator.h"

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/memory_ledger.h"
#include "tensor/tensor.h"

namespace tensor {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

CpuCacheOptions Options(int64_t cap_bytes, int64_t min_cached_bytes = kMiB) {
  CpuCacheOptions o;
  o.cap_bytes = cap_bytes;
  o.min_cached_bytes = min_cached_bytes;
  return o;
}

// Resident set size of this process in bytes (/proc/self/statm).
int64_t ResidentBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * sysconf(_SC_PAGESIZE) : -1;
}

void TouchPages(void* p, int64_t bytes) {
  char* c = static_cast<char*>(p);
  for (int64_t i = 0; i < bytes; i += 4096) c[i] = 1;
}

TEST(CpuAllocatorTest, SizeClassesRoundUpByAtMostAnEighth) {
  int64_t previous = 0;
  for (int64_t bytes = kMiB; bytes < 600 * kMiB; bytes += 12345 * 7 + bytes / 5) {
    const int64_t c = CpuCachingAllocator::SizeClass(bytes);
    EXPECT_GE(c, bytes);
    EXPECT_LE(c, bytes + bytes / 8) << bytes;
    EXPECT_EQ(c % 4096, 0) << bytes;
    EXPECT_GE(c, previous);
    previous = c;
  }
  EXPECT_EQ(CpuCachingAllocator::SizeClass(3 * kMiB), 3 * kMiB);
  EXPECT_EQ(CpuCachingAllocator::SizeClass(3 * kMiB + 1), 3 * kMiB + kMiB / 4);
  EXPECT_EQ(CpuCachingAllocator::SizeClass(200'000'000), 192 * kMiB);
}

TEST(CpuAllocatorTest, CapComesFromTheEnvironment) {
  const char* saved = std::getenv("FSDP_CPU_CACHE_MB");
  const std::string restore = saved ? saved : "";
  setenv("FSDP_CPU_CACHE_MB", "7", 1);
  EXPECT_EQ(CpuCacheOptions::FromEnv().cap_bytes, 7 * kMiB);
  setenv("FSDP_CPU_CACHE_MB", "0", 1);
  EXPECT_EQ(CpuCacheOptions::FromEnv().cap_bytes, 0);
  unsetenv("FSDP_CPU_CACHE_MB");
  const int64_t fallback = CpuCacheOptions::FromEnv().cap_bytes;
  EXPECT_TRUE(fallback == 4096 * kMiB || fallback == 0);  // 0 in ASan builds
  setenv("FSDP_CPU_CACHE_MB", "12abc", 1);
  EXPECT_EQ(CpuCacheOptions::FromEnv().cap_bytes, fallback);
  setenv("FSDP_CPU_CACHE_MB", "-5", 1);
  EXPECT_EQ(CpuCacheOptions::FromEnv().cap_bytes, fallback);
  if (saved) {
    setenv("FSDP_CPU_CACHE_MB", restore.c_str(), 1);
  } else {
    unsetenv("FSDP_CPU_CACHE_MB");
  }
}

TEST(CpuAllocatorTest, FreedLargeBlockIsReused) {
  CpuCachingAllocator alloc(Options(64 * kMiB));
  void* p = alloc.Allocate(3 * kMiB);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  TouchPages(p, 3 * kMiB);
  alloc.Deallocate(p, 3 * kMiB);
  EXPECT_EQ(alloc.Stats().cached_bytes, 3 * kMiB);
  EXPECT_EQ(alloc.Stats().cached_blocks, 1);
  // A request of another size in the same class gets the same block.
  void* q = alloc.Allocate(3 * kMiB - 1000);
  EXPECT_EQ(q, p);
  CpuCacheStats s = alloc.Stats();
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.cached_bytes, 0);
  EXPECT_EQ(s.reserved_bytes, 3 * kMiB);
  // A different class does not.
  void* r = alloc.Allocate(5 * kMiB);
  EXPECT_NE(r, p);
  EXPECT_EQ(alloc.Stats().misses, 2);
  alloc.Deallocate(q, 3 * kMiB - 1000);
  alloc.Deallocate(r, 5 * kMiB);
  s = alloc.Stats();
  EXPECT_EQ(s.cached_bytes, 8 * kMiB);
  EXPECT_EQ(s.reserved_bytes, 8 * kMiB);
  EXPECT_EQ(s.peak_reserved_bytes, 8 * kMiB);
}

TEST(CpuAllocatorTest, SmallBlocksAreNotCached) {
  CpuCachingAllocator alloc(Options(64 * kMiB));
  void* p = alloc.Allocate(kMiB - 64);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  std::memset(p, 0, kMiB - 64);
  alloc.Deallocate(p, kMiB - 64);
  const CpuCacheStats s = alloc.Stats();
  EXPECT_EQ(s.cached_bytes, 0);
  EXPECT_EQ(s.hits + s.misses, 0);
  EXPECT_EQ(s.reserved_bytes, 0);
}

TEST(CpuAllocatorTest, CapIsRespectedLeastRecentlyFreedGoFirst) {
  CpuCachingAllocator alloc(Options(8 * kMiB));
  void* p[4];
  for (void*& b : p) b = alloc.Allocate(3 * kMiB);
  for (void* b : p) alloc.Deallocate(b, 3 * kMiB);
  CpuCacheStats s = alloc.Stats();
  EXPECT_EQ(s.cached_bytes, 6 * kMiB);  // two blocks fit under 8 MiB
  EXPECT_EQ(s.cached_blocks, 2);
  EXPECT_EQ(s.evicted_blocks, 2);
  EXPECT_EQ(s.reserved_bytes, 6 * kMiB);
  EXPECT_LE(s.cached_bytes, s.cap_bytes);
  // The two kept are the last two freed, newest first.
  EXPECT_EQ(alloc.Allocate(3 * kMiB), p[3]);
  EXPECT_EQ(alloc.Allocate(3 * kMiB), p[2]);
  alloc.Deallocate(p[3], 3 * kMiB);
  alloc.Deallocate(p[2], 3 * kMiB);

  // A block of another class evicts the oldest block to fit.
  void* big = alloc.Allocate(5 * kMiB);
  alloc.Deallocate(big, 5 * kMiB);
  s = alloc.Stats();
  EXPECT_EQ(s.cached_bytes, 8 * kMiB);  // p[2] (3 MiB) and big (5 MiB)
  EXPECT_EQ(s.evicted_blocks, 3);
  EXPECT_EQ(alloc.Allocate(3 * kMiB), p[2]);
  alloc.Deallocate(p[2], 3 * kMiB);

  // A block larger than the whole cap is never kept and evicts nothing.
  const int64_t before = alloc.Stats().cached_bytes;
  void* huge = alloc.Allocate(9 * kMiB);
  alloc.Deallocate(huge, 9 * kMiB);
  s = alloc.Stats();
  EXPECT_EQ(s.cached_bytes, before);
  EXPECT_EQ(s.reserved_bytes, before);
}

TEST(CpuAllocatorTest, CapZeroDisablesCaching) {
  CpuCachingAllocator alloc(Options(0));
  void* p = alloc.Allocate(4 * kMiB);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  TouchPages(p, 4 * kMiB);
  alloc.Deallocate(p, 4 * kMiB);
  const CpuCacheStats s = alloc.Stats();
  EXPECT_EQ(s.cached_bytes, 0);
  EXPECT_EQ(s.hits + s.misses, 0);
  EXPECT_EQ(s.reserved_bytes, 0);
}

TEST(CpuAllocatorTest, ReleaseCachedMemoryReturnsMemoryToTheSystem) {
  CpuCachingAllocator alloc(Options(1024 * kMiB));
  constexpr int64_t kBytes = 96 * kMiB;
  void* p = alloc.Allocate(kBytes);
  TouchPages(p, kBytes);
  alloc.Deallocate(p, kBytes);
  const int64_t rss_cached = ResidentBytes();
  ASSERT_GT(rss_cached, 0);
  EXPECT_EQ(alloc.Stats().cached_bytes, kBytes);
  EXPECT_EQ(alloc.ReleaseCachedMemory(), kBytes);
  const int64_t rss_released = ResidentBytes();
  EXPECT_GE(rss_cached - rss_released, 64 * kMiB) << "RSS " << rss_cached << " -> " << rss_released;
  const CpuCacheStats s = alloc.Stats();
  EXPECT_EQ(s.cached_bytes, 0);
  EXPECT_EQ(s.cached_blocks, 0);
  EXPECT_EQ(s.reserved_bytes, 0);
  EXPECT_EQ(alloc.ReleaseCachedMemory(), 0);
  void* q = alloc.Allocate(kBytes);  // a miss again
  EXPECT_EQ(alloc.Stats().misses, 2);
  alloc.Deallocate(q, kBytes);
}

// Through Tensor and the process allocator: reuse, and the ledger charges the
// requested bytes while a storage lives and nothing for cached blocks.
TEST(CpuAllocatorTest, TensorsReuseBlocksAndTheLedgerStaysExact) {
  CpuCachingAllocator& process = ProcessCpuAllocator();
  if (process.options().cap_bytes == 0) GTEST_SKIP() << "FSDP_CPU_CACHE_MB=0: caching off";
  ASSERT_EQ(&AllocatorFor(Device::Cpu()), &process);
  MemoryLedger ledger;
  ScopedLedger use(&ledger);
  const Device cpu = Device::Cpu();
  Tensor a = Tensor::Empty({1'500'001}, Dtype::kU8);
  void* p = a.raw_data();
  EXPECT_EQ(ledger.Total(cpu).current, 1'500'001);
  const CpuCacheStats before = process.Stats();
  a = Tensor();
  EXPECT_EQ(ledger.Total(cpu).current, 0);  // cached bytes are not in the ledger
  EXPECT_EQ(process.Stats().cached_bytes,
            before.cached_bytes + CpuCachingAllocator::SizeClass(1'500'001));
  Tensor b = Tensor::Empty({1'500'001 / 4 + 1}, Dtype::kF32);  // same class
  EXPECT_EQ(b.raw_data(), p);
  EXPECT_EQ(process.Stats().hits, before.hits + 1);
  EXPECT_EQ(ledger.Total(cpu).current, (1'500'001 / 4 + 1) * 4);
  EXPECT_EQ(ledger.Total(cpu).peak, (1'500'001 / 4 + 1) * 4);
  b = Tensor();
  EXPECT_EQ(ledger.Total(cpu).current, 0);
  EXPECT_GE(ReleaseCachedMemory(), CpuCachingAllocator::SizeClass(1'500'001));
  EXPECT_EQ(process.Stats().cached_bytes, 0);
}

// Threads allocate, write, check and free blocks of a few classes (and small
// ones) at once: no block is handed to two owners, the counters add up.
TEST(CpuAllocatorTest, ConcurrentThreadsAreSafe) {
  CpuCachingAllocator alloc(Options(12 * kMiB));
  constexpr int kThreads = 4;
  constexpr int kIters = 300;
  const int64_t sizes[] = {kMiB, kMiB + kMiB / 2, 2 * kMiB + 17, 5 * kMiB, 4000, 700 * 1024};
  std::atomic<int64_t> large_allocs{0};
  std::atomic<int> corrupted{0};
  auto work = [&](int id) {
    std::mt19937 rng(id);
    struct Held {
      unsigned char* p;
      int64_t bytes;
      unsigned char tag;
    };
    std::vector<Held> held;
    auto release_one = [&] {
      const Held h = held.back();
      held.pop_back();
      if (h.p[0] != h.tag || h.p[h.bytes / 2] != h.tag || h.p[h.bytes - 1] != h.tag) ++corrupted;
      alloc.Deallocate(h.p, h.bytes);
    };
    for (int i = 0; i < kIters; ++i) {
      const int64_t bytes = sizes[rng() % (sizeof(sizes) / sizeof(sizes[0]))];
      auto* p = static_cast<unsigned char*>(alloc.Allocate(bytes));
      if (bytes >= kMiB) ++large_allocs;
      const auto tag = static_cast<unsigned char>(id * 64 + i % 64);
      p[0] = p[bytes / 2] = p[bytes - 1] = tag;
      held.push_back({p, bytes, tag});
      if (held.size() > 3 || rng() % 2 == 0) release_one();
    }
    while (!held.empty()) release_one();
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(work, t);
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(corrupted.load(), 0);
  const CpuCacheStats s = alloc.Stats();
  EXPECT_EQ(s.hits + s.misses, large_allocs.load());
  EXPECT_GT(s.hits, 0);
  EXPECT_LE(s.cached_bytes, 12 * kMiB);
  EXPECT_EQ(s.reserved_bytes, s.cached_bytes);  // everything was freed
  alloc.ReleaseCachedMemory();
  EXPECT_EQ(alloc.Stats().reserved_bytes, 0);
}

// Ranks as threads, each with its own ledger, through Tensor: ledgers exact.
TEST(CpuAllocatorTest, ConcurrentTensorsKeepPerThreadLedgersExact) {
  constexpr int kThreads = 3;
  MemoryLedger ledgers[kThreads];
  auto work = [&](int id) {
    ScopedLedger use(&ledgers[id]);
    for (int i = 0; i < 50; ++i) {
      Tensor a = Tensor::Empty({(id + 1) * 300'000});  // 1.2 / 2.4 / 3.6 MB f32
      a.data<float>()[0] = 1.0f;
      Tensor b = Tensor::Empty({1000});
      b.data<float>()[0] = 2.0f;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(work, t);
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(ledgers[t].Total(Device::Cpu()).current, 0);
    EXPECT_EQ(ledgers[t].Total(Device::Cpu()).peak, (t + 1) * 1'200'000 + 4000);
  }
}

}  // namespace
}  // namespace tensor
