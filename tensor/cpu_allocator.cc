// The CPU caching allocator (see cpu_allocator.h).
#include "tensor/cpu_allocator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <iterator>
#include <new>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensor/memory_ledger.h"

namespace tensor {
namespace {

// The host refused a block: what it had (Storage::Allocate adds the request).
OutOfMemoryError HostOutOfMemory(const char* call) {
  const int64_t page = sysconf(_SC_PAGESIZE);
  return OutOfMemoryError(absl::StrCat("the host refused it (", call, "; ",
                                       FormatBytes(sysconf(_SC_AVPHYS_PAGES) * page), " of ",
                                       FormatBytes(sysconf(_SC_PHYS_PAGES) * page),
                                       " of RAM free)"));
}

constexpr int64_t kAlign = 64;
constexpr int64_t kPage = 4096;

void* MapBlock(int64_t size) {
  void* p = mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void UnmapBlock(void* p, int64_t size) { munmap(p, static_cast<size_t>(size)); }

// Under AddressSanitizer caching is off unless FSDP_CPU_CACHE_MB asks for it:
// a cached block's reuse would hide use-after-free from ASan.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAsan = true;
#else
constexpr bool kAsan = false;
#endif
#else
constexpr bool kAsan = false;
#endif

}  // namespace

CpuCacheOptions CpuCacheOptions::FromEnv() {
  CpuCacheOptions options;
  if (kAsan) options.cap_bytes = 0;
  if (const char* env = std::getenv("FSDP_CPU_CACHE_MB"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    errno = 0;
    const long long mb = std::strtoll(env, &end, 10);
    if (errno == 0 && *end == '\0' && mb >= 0 && mb < (int64_t{1} << 43)) {
      options.cap_bytes = static_cast<int64_t>(mb) << 20;
    }
  }
  return options;
}

CpuCachingAllocator::CpuCachingAllocator(CpuCacheOptions options) : options_(options) {
  stats_.cap_bytes = options_.cap_bytes;
  stats_.min_cached_bytes = options_.min_cached_bytes;
}

CpuCachingAllocator::~CpuCachingAllocator() { ReleaseCachedMemory(); }

int64_t CpuCachingAllocator::SizeClass(int64_t bytes) {
  if (bytes <= kPage) return kPage;
  const int top_bit = 63 - __builtin_clzll(static_cast<unsigned long long>(bytes));
  const int64_t step = std::max<int64_t>(kPage, (int64_t{1} << top_bit) / 8);
  return (bytes + step - 1) / step * step;
}

void* CpuCachingAllocator::Allocate(int64_t bytes) {
  if (!Cached(bytes)) {
    const int64_t rounded = ((bytes + kAlign - 1) / kAlign) * kAlign;
    void* p = std::aligned_alloc(kAlign, rounded == 0 ? kAlign : rounded);
    if (p == nullptr) throw HostOutOfMemory("aligned_alloc");
    return p;
  }
  const int64_t size = SizeClass(bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(size);
    if (it != free_.end()) {
      std::deque<LruList::iterator>& blocks = it->second;
      const LruList::iterator newest = blocks.back();
      void* p = newest->ptr;
      blocks.pop_back();
      if (blocks.empty()) free_.erase(it);
      lru_.erase(newest);
      stats_.cached_bytes -= size;
      --stats_.cached_blocks;
      ++stats_.hits;
      return p;
    }
  }
  void* p = MapBlock(size);
  if (p == nullptr) {
    ReleaseCachedMemory();
    p = MapBlock(size);
    if (p == nullptr) throw HostOutOfMemory("mmap, after releasing the cached blocks");
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.misses;
  stats_.reserved_bytes += size;
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  return p;
}

void CpuCachingAllocator::Deallocate(void* ptr, int64_t bytes) {
  if (ptr == nullptr) return;
  if (!Cached(bytes)) {
    std::free(ptr);
    return;
  }
  const int64_t size = SizeClass(bytes);
  std::vector<FreeBlock> evicted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (size > options_.cap_bytes) {
      evicted.push_back({ptr, size});  // never fits: straight back to the system
    } else {
      // Make room by evicting the least recently freed blocks.
      while (stats_.cached_bytes + size > options_.cap_bytes) {
        const LruList::iterator oldest = lru_.begin();
        auto cls = free_.find(oldest->size);
        // Within a class, blocks sit in lru_ in the order of their deque.
        cls->second.pop_front();
        if (cls->second.empty()) free_.erase(cls);
        evicted.push_back(*oldest);
        stats_.cached_bytes -= oldest->size;
        --stats_.cached_blocks;
        lru_.erase(oldest);
      }
      lru_.push_back({ptr, size});
      free_[size].push_back(std::prev(lru_.end()));
      stats_.cached_bytes += size;
      ++stats_.cached_blocks;
    }
    for (const FreeBlock& b : evicted) stats_.reserved_bytes -= b.size;
    stats_.evicted_blocks += static_cast<int64_t>(evicted.size());
  }
  for (const FreeBlock& b : evicted) UnmapBlock(b.ptr, b.size);
}

int64_t CpuCachingAllocator::ReleaseCachedMemory() {
  LruList released;
  int64_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    released.swap(lru_);
    free_.clear();
    bytes = stats_.cached_bytes;
    stats_.reserved_bytes -= bytes;
    stats_.cached_bytes = 0;
    stats_.cached_blocks = 0;
  }
  for (const FreeBlock& b : released) UnmapBlock(b.ptr, b.size);
  return bytes;
}

CpuCacheStats CpuCachingAllocator::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

CpuCachingAllocator& ProcessCpuAllocator() {
  // Never destroyed: storages may outlive main.
  static CpuCachingAllocator* const allocator = new CpuCachingAllocator(CpuCacheOptions::FromEnv());
  return *allocator;
}

int64_t ReleaseCachedMemory() { return ProcessCpuAllocator().ReleaseCachedMemory(); }

}  // namespace tensor
