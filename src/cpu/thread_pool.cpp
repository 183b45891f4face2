#include "cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#define FLASHATTN_HAVE_PTHREAD_ATFORK 1
#else
#define FLASHATTN_HAVE_PTHREAD_ATFORK 0
#endif

namespace flashattn::cpu {
namespace {

// More threads than this are never started, whatever is requested.
constexpr int kMaxThreads = 1024;

// Set on pool workers and on a caller while it runs items: a parallel_for from such a thread
// runs serially instead of waiting for workers that are busy with the outer loop.
thread_local bool t_inside_parallel_region = false;

struct Job {
  const ItemFunction* body = nullptr;
  int64_t count = 0;
  int workers = 0;  // participants, the caller included
  std::atomic<int64_t> next{0};
};

void run_items(Job& job, int worker) {
  for (;;) {
    const int64_t item = job.next.fetch_add(1, std::memory_order_relaxed);
    if (item >= job.count) return;
    (*job.body)(item, worker);
  }
}

class ThreadPool {
 public:
  void run(int64_t count, int threads, const ItemFunction& body) {
    std::lock_guard<std::mutex> call_lock(call_mutex_);
    const int wanted = parallel_workers(count, threads);
    const int workers = 1 + ensure_threads(wanted - 1);
    Job job;
    job.body = &body;
    job.count = count;
    job.workers = workers;
    if (workers > 1) {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &job;
      pending_ = workers - 1;
      ++generation_;
    }
    if (workers > 1) work_ready_.notify_all();
    t_inside_parallel_region = true;
    run_items(job, 0);
    t_inside_parallel_region = false;
    if (workers > 1) {
      std::unique_lock<std::mutex> lock(mutex_);
      job_done_.wait(lock, [&] { return pending_ == 0; });
      job_ = nullptr;
    }
  }

 private:
  // Starts threads until `n` exist (or creation fails); returns how many exist.
  int ensure_threads(int n) {
    while (static_cast<int>(threads_.size()) < n) {
      const int index = static_cast<int>(threads_.size());
      try {
        threads_.emplace_back([this, index] { worker_loop(index + 1); });
      } catch (const std::system_error&) {
        break;
      }
    }
    return std::min(n, static_cast<int>(threads_.size()));
  }

  void worker_loop(int worker) {
    t_inside_parallel_region = true;
    uint64_t seen = 0;
    for (;;) {
      Job* job = nullptr;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        work_ready_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        job = job_;
        if (job == nullptr || worker >= job->workers) continue;  // not part of this loop
      }
      run_items(*job, worker);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (--pending_ == 0) job_done_.notify_one();
      }
    }
  }

  std::mutex call_mutex_;  // one parallel loop at a time
  std::mutex mutex_;       // guards job_, pending_, generation_
  std::condition_variable work_ready_;
  std::condition_variable job_done_;
  std::vector<std::thread> threads_;
  Job* job_ = nullptr;
  int pending_ = 0;  // workers (besides the caller) still running the current job
  uint64_t generation_ = 0;
};

// The pool lives for the whole process and is never destroyed: its threads sleep between
// loops and end with the process. After fork() the child has none of the parent's threads, so
// it drops the inherited pool (without touching it: its mutexes may be held by threads that no
// longer exist) and starts a fresh one on first use.
std::atomic<ThreadPool*> g_pool{nullptr};

#if FLASHATTN_HAVE_PTHREAD_ATFORK
void forget_pool_in_child() { g_pool.store(nullptr, std::memory_order_relaxed); }
#endif

ThreadPool& pool() {
  ThreadPool* p = g_pool.load(std::memory_order_acquire);
  if (p != nullptr) return *p;
#if FLASHATTN_HAVE_PTHREAD_ATFORK
  static std::once_flag registered;
  std::call_once(registered, [] { pthread_atfork(nullptr, nullptr, forget_pool_in_child); });
#endif
  auto* fresh = new ThreadPool();
  if (g_pool.compare_exchange_strong(p, fresh, std::memory_order_acq_rel)) return *fresh;
  delete fresh;
  return *p;
}

int positive_env_int(const char* name) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return 0;
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (*end != '\0' || v <= 0) return 0;
  return static_cast<int>(std::min<long>(v, kMaxThreads));
}

}  // namespace

int resolve_num_threads(int requested) {
  if (requested > 0) return std::min(requested, kMaxThreads);
  if (const int env = positive_env_int("FLASHATTN_NUM_THREADS"); env > 0) return env;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(std::min<unsigned>(hw, kMaxThreads));
}

int parallel_workers(int64_t count, int threads) {
  const int64_t n = std::min<int64_t>(std::max(threads, 1), std::max<int64_t>(count, 1));
  return static_cast<int>(std::min<int64_t>(n, kMaxThreads));
}

void parallel_for(int64_t count, int threads, const ItemFunction& body) {
  if (count <= 0) return;
  if (t_inside_parallel_region || parallel_workers(count, threads) == 1) {
    for (int64_t i = 0; i < count; ++i) body(i, 0);
    return;
  }
  pool().run(count, threads, body);
}

}  // namespace flashattn::cpu
