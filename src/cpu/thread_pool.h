// The CPU backend's worker threads: one process-wide pool, grown on demand, that runs a
// parallel loop over independent work items.
//
// Determinism does not depend on the pool: every work item writes its own outputs and uses the
// scratch of the worker running it, so which worker runs which item never changes a result.
#pragma once

#include <cstdint>

namespace flashattn::cpu {

// Threads a call uses: `requested` if > 0, else FLASHATTN_NUM_THREADS if set to a positive
// integer, else std::thread::hardware_concurrency() (at least 1).
int resolve_num_threads(int requested);

// A non-owning reference to a callable `void(int64_t item, int worker)`.
class ItemFunction {
 public:
  template <class F>
  explicit ItemFunction(F& f)
      : object_(&f),
        call_([](void* o, int64_t item, int worker) { (*static_cast<F*>(o))(item, worker); }) {}
  void operator()(int64_t item, int worker) const { call_(object_, item, worker); }

 private:
  void* object_;
  void (*call_)(void*, int64_t, int);
};

// Number of workers parallel_for(count, threads, ...) will use: min(threads, count), at
// least 1 (callers size per-worker scratch with it).
int parallel_workers(int64_t count, int threads);

// Runs body(item, worker) for every item in [0, count), items handed out in increasing order
// to up to parallel_workers(count, threads) threads, the calling thread included; `worker` is
// in [0, parallel_workers(...)) and is never used by two running calls of body at once.
// Returns when every item is done. body must not throw.
//
// Concurrent calls from several threads are serialised; a call from inside body (nested
// parallelism) runs serially on the calling worker. If threads cannot be created the loop runs
// on the threads that exist (possibly only the caller).
void parallel_for(int64_t count, int threads, const ItemFunction& body);

}  // namespace flashattn::cpu
