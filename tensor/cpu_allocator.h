// The CPU allocator: a caching layer for large blocks over the system allocator.
//
// Every op allocates its output, and glibc serves large blocks (above its mmap
// threshold, at most 32 MiB) with a fresh mmap: each use of a big tensor, e.g.
// the (B, T, vocab) logits, page-faults all of its memory again, which costs
// milliseconds per op. This allocator keeps freed blocks of at least
// `min_cached_bytes` in free lists keyed by a rounded size class (8 classes per
// power of two, so at most 12.5% of a block is rounding) and hands them out
// again, already mapped and faulted in. Small blocks go straight to
// aligned_alloc / free, as before.
//
// The cache holds at most `cap_bytes` of free blocks; when a freed block would
// exceed it, the least recently freed blocks are returned to the system first
// (a block larger than the whole cap is never kept). A cap of 0 turns caching
// off entirely (every block from aligned_alloc / free). When mmap fails the
// cache is released and the request retried once.
//
// Cached-but-free memory is not in the memory ledger: the ledger charges the
// bytes a Storage asked for while it lives (tensor/allocator.cc), whatever
// allocator serves them. The cache's own numbers are in Stats().
//
// Thread-safe (ranks run as threads): one mutex, held only for free-list
// updates, never across mmap / munmap / page faults.
#ifndef TENSOR_CPU_ALLOCATOR_H_
#define TENSOR_CPU_ALLOCATOR_H_

#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <mutex>

#include "tensor/allocator.h"

namespace tensor {

struct CpuCacheOptions {
  // Blocks of at least this many bytes are cached; smaller ones are not.
  int64_t min_cached_bytes = int64_t{1} << 20;
  // The most bytes of free blocks the cache may hold; 0 disables caching.
  int64_t cap_bytes = int64_t{4096} << 20;

  // The process defaults: cap from the environment variable FSDP_CPU_CACHE_MB
  // (MiB; 0 disables caching), 4096 MiB when unset or not a number (0 in
  // AddressSanitizer builds, so that use-after-free stays visible).
  static CpuCacheOptions FromEnv();
};

struct CpuCacheStats {
  int64_t cached_bytes = 0;  // free blocks held by the cache (not in any ledger)
  int64_t cached_blocks = 0;
  int64_t reserved_bytes = 0;  // mapped by the cache: blocks in use plus cached ones
  int64_t peak_reserved_bytes = 0;
  int64_t hits = 0;            // large requests served from the cache
  int64_t misses = 0;          // large requests that mapped a new block
  int64_t evicted_blocks = 0;  // freed blocks returned to the system because of the cap
  int64_t cap_bytes = 0;
  int64_t min_cached_bytes = 0;
};

class CpuCachingAllocator final : public Allocator {
 public:
  explicit CpuCachingAllocator(CpuCacheOptions options = CpuCacheOptions());
  // Returns the cached blocks to the system (blocks still in use are the caller's bug).
  ~CpuCachingAllocator() override;
  CpuCachingAllocator(const CpuCachingAllocator&) = delete;
  CpuCachingAllocator& operator=(const CpuCachingAllocator&) = delete;

  // 64-byte aligned (page aligned for cached sizes); throws std::bad_alloc.
  void* Allocate(int64_t bytes) override;
  // `bytes` must be the value passed to Allocate.
  void Deallocate(void* ptr, int64_t bytes) override;

  // Returns every cached free block to the system; returns the bytes released.
  int64_t ReleaseCachedMemory();
  CpuCacheStats Stats() const;
  const CpuCacheOptions& options() const { return options_; }

  // The size of the block that serves a request of `bytes` (>= min_cached_bytes):
  // rounded up to an eighth of the power of two at or below it, at least a page.
  static int64_t SizeClass(int64_t bytes);

 private:
  bool Cached(int64_t bytes) const {
    return options_.cap_bytes > 0 && bytes >= options_.min_cached_bytes;
  }
  struct FreeBlock {
    void* ptr;
    int64_t size;  // the size class
  };
  using LruList = std::list<FreeBlock>;  // least recently freed first

  const CpuCacheOptions options_;
  mutable std::mutex mu_;
  LruList lru_;
  // Per size class, its free blocks in the order they were freed (the same
  // order as in lru_): reuse takes the newest, eviction the oldest.
  std::map<int64_t, std::deque<LruList::iterator>> free_;
  CpuCacheStats stats_;
};

// The process CPU allocator (AllocatorFor(Device::Cpu())), made on first use
// with CpuCacheOptions::FromEnv().
CpuCachingAllocator& ProcessCpuAllocator();

// Returns the process CPU allocator's cached free blocks to the system; the
// bytes released.
int64_t ReleaseCachedMemory();

}  // namespace tensor

#endif  // TENSOR_CPU_ALLOCATOR_H_
