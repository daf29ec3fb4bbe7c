// A thread-safe LRU cache of shared, immutable values (the GEMM caches of the
// CPU and CUDA backends: oneDNN primitives, cuBLASLt descriptors). Creating a
// value may be slow, so it happens outside the lock: Find misses, the caller
// creates, Insert keeps the first value inserted for a key (two threads that
// missed on the same key both create one; the first wins).
#ifndef TENSOR_LRU_CACHE_H_
#define TENSOR_LRU_CACHE_H_

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace tensor {

struct LruCacheStats {
  int64_t entries = 0;
  int64_t hits = 0;
  int64_t misses = 0;
};

template <typename Key, typename Value, typename Hash = std::hash<Key>>
class LruCache {
 public:
  explicit LruCache(int64_t capacity) : capacity_(capacity) {}
  LruCache(const LruCache&) = delete;
  LruCache& operator=(const LruCache&) = delete;

  // The value of `key` (now the most recently used), or nullptr (a miss).
  std::shared_ptr<const Value> Find(const Key& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) {
      ++misses_;
      return nullptr;
    }
    ++hits_;
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->second;
  }

  // Keeps `value` under `key` unless one is there already; returns the kept
  // one. Evicts the least recently used entries beyond the capacity.
  std::shared_ptr<const Value> Insert(const Key& key, std::shared_ptr<const Value> value) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it != map_.end()) return it->second->second;
    lru_.emplace_front(key, std::move(value));
    map_.emplace(key, lru_.begin());
    while (static_cast<int64_t>(lru_.size()) > capacity_) {
      map_.erase(lru_.back().first);
      lru_.pop_back();
    }
    return lru_.front().second;
  }

  LruCacheStats Stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return {static_cast<int64_t>(lru_.size()), hits_, misses_};
  }

 private:
  using Item = std::pair<Key, std::shared_ptr<const Value>>;
  const int64_t capacity_;
  std::mutex mu_;
  std::list<Item> lru_;  // most recently used first
  std::unordered_map<Key, typename std::list<Item>::iterator, Hash> map_;
  int64_t hits_ = 0;
  int64_t misses_ = 0;
};

}  // namespace tensor

#endif  // TENSOR_LRU_CACHE_H_
