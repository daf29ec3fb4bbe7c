// One pool of worker threads for the CPU kernels.
//
// ParallelFor splits [0, n) into chunks of at least `grain` items; the calling
// thread works on chunks too, so calls from several threads at once (ranks as
// threads) and nested calls are safe and cannot deadlock.
#ifndef TENSOR_THREAD_POOL_H_
#define TENSOR_THREAD_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace tensor {

class ThreadPool {
 public:
  // A pool with `num_threads` threads in all, the caller included (so
  // num_threads - 1 workers). num_threads <= 1 runs everything inline.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over disjoint chunks covering [0, n); returns when all are done.
  // The chunking depends only on n, grain and num_threads(), never on timing.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  struct Job;
  void WorkerLoop();
  static void RunChunks(Job& job);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stop_ = false;
};

// The pool the CPU kernels use: as many threads as the machine has cores, or
// FSDP_NUM_THREADS when set. Created on first use.
ThreadPool& DefaultThreadPool();

// DefaultThreadPool().ParallelFor(...).
void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace tensor

#endif  // TENSOR_THREAD_POOL_H_
