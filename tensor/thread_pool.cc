// Thread pool: a shared queue of jobs; each job is a counter of chunks that any
// thread (workers and the caller) claims until none are left.
#include "tensor/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>

namespace tensor {

struct ThreadPool::Job {
  int64_t n = 0;
  int64_t chunk = 0;
  int64_t num_chunks = 0;
  const std::function<void(int64_t, int64_t)>* fn = nullptr;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex mu;
  std::condition_variable finished;
  std::exception_ptr error;  // first exception thrown by a chunk
};

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunChunks(Job& job) {
  int64_t finished_here = 0;
  for (;;) {
    const int64_t c = job.next.fetch_add(1);
    if (c >= job.num_chunks) break;
    const int64_t begin = c * job.chunk;
    const int64_t end = std::min(job.n, begin + job.chunk);
    try {
      (*job.fn)(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(job.mu);
      if (!job.error) job.error = std::current_exception();
    }
    ++finished_here;
  }
  if (finished_here > 0 && job.done.fetch_add(finished_here) + finished_here == job.num_chunks) {
    std::lock_guard<std::mutex> lock(job.mu);
    job.finished.notify_all();
  }
}

void ThreadPool::WorkerLoop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (stop_ && queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    RunChunks(*job);
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t max_chunks = std::min<int64_t>((n + grain - 1) / grain, num_threads());
  if (max_chunks <= 1 || workers_.empty()) {
    fn(0, n);
    return;
  }
  auto job = std::make_shared<Job>();
  job->n = n;
  job->chunk = (n + max_chunks - 1) / max_chunks;
  job->num_chunks = (n + job->chunk - 1) / job->chunk;
  job->fn = &fn;
  const int64_t helpers = std::min<int64_t>(job->num_chunks - 1, workers_.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t i = 0; i < helpers; ++i) queue_.push_back(job);
  }
  if (helpers == 1) {
    cv_.notify_one();
  } else {
    cv_.notify_all();
  }
  RunChunks(*job);
  {
    std::unique_lock<std::mutex> lock(job->mu);
    job->finished.wait(lock, [&] { return job->done.load() == job->num_chunks; });
  }
  if (job->error) std::rethrow_exception(job->error);
}

ThreadPool& DefaultThreadPool() {
  static ThreadPool* const pool = [] {
    int n = static_cast<int>(std::thread::hardware_concurrency());
    if (const char* env = std::getenv("FSDP_NUM_THREADS")) n = std::atoi(env);
    return new ThreadPool(std::max(n, 1));
  }();
  return *pool;
}

void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  DefaultThreadPool().ParallelFor(n, grain, fn);
}

}  // namespace tensor
