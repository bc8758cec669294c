#pragma once
// A fixed pool of worker threads for compute kernels.
//
// parallel_for(n, fn) splits [0, n) statically into size() contiguous chunks of n / size()
// items, the first n % size() chunks taking one more (see chunk_range), and calls
// fn(begin, end, t) for every non-empty chunk t. The split depends only on n
// and size(), never on timing, so per-chunk partial sums reduce the same way every call.
// The calling thread runs chunk 0; workers spin briefly on an epoch counter before sleeping
// on a condition variable, and nothing is heap-allocated per call (fn is passed as a
// type-erased pointer, not a std::function).
//
// An exception thrown by fn is rethrown on the caller once no chunk is running any more;
// when several chunks throw, the lowest chunk index wins. A parallel_for issued from inside
// fn (of any pool) runs its chunks inline on the calling thread in chunk order, so nesting
// neither deadlocks nor changes the split. Calls from several outside threads take turns.
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace metrale {

class ThreadPool {
 public:
  // `n_threads` counts the caller too: ThreadPool(4) starts 3 workers. Must be >= 1.
  // `spin_us` is how long an idle worker polls before sleeping (0: sleep at once).
  explicit ThreadPool(int n_threads, int spin_us = kDefaultSpinUs);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  template <typename F>
  void parallel_for(size_t n, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    run(n, &invoke<Fn>, const_cast<void*>(static_cast<const void*>(std::addressof(fn))));
  }

  // Like parallel_for, but [0, n) is cut into pieces of `grain` items that the threads
  // claim in turn as they finish the previous one, so a thread slowed by the machine (a
  // descheduled vCPU, a noisy neighbour) takes fewer pieces. Which thread runs a piece is
  // timing-dependent: use it only where an item's result does not depend on the thread or
  // on the other items of its piece (e.g. output rows of a matrix product). fn may also get
  // larger ranges: a call with n <= grain, or nested in a job, runs inline as parallel_for
  // does. When fn throws, that thread stops claiming, the others finish, and the exception
  // of the lowest-numbered throwing thread is rethrown.
  template <typename F>
  void parallel_for_dynamic(size_t n, size_t grain, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    run(n, &invoke<Fn>, const_cast<void*>(static_cast<const void*>(std::addressof(fn))), grain);
  }

  // Chunk `t` of the static split of [0, n) over `n_chunks` chunks.
  static void chunk_range(size_t n, int n_chunks, int t, size_t* begin, size_t* end);

  // Long enough to bridge the serial work between two kernels of one decode step.
  static constexpr int kDefaultSpinUs = 50;

 private:
  using Thunk = void (*)(void* fn, size_t begin, size_t end, int thread_index);

  template <typename Fn>
  static void invoke(void* fn, size_t begin, size_t end, int thread_index) {
    (*static_cast<Fn*>(fn))(begin, end, thread_index);
  }

  // grain 0: the static split; otherwise pieces of `grain` claimed from next_.
  void run(size_t n, Thunk thunk, void* fn, size_t grain = 0);
  void run_inline(size_t n, Thunk thunk, void* fn);
  void run_chunk(int t);
  void worker_loop(int t);
  void wait_for_workers();

  const int n_threads_;
  const int spin_us_;
  std::vector<std::thread> workers_;
  std::vector<std::exception_ptr> errors_;  // one slot per chunk, reused across calls

  // The current job; written by the dispatcher before it bumps epoch_ (release).
  Thunk thunk_ = nullptr;
  void* fn_ = nullptr;
  size_t n_ = 0;
  size_t grain_ = 0;
  std::atomic<size_t> next_{0};  // first unclaimed item of a dynamic job

  std::atomic<uint32_t> epoch_{0};
  std::atomic<int> pending_{0};              // workers still running the current job
  std::atomic<int> sleepers_{0};             // workers blocked on wake_cv_
  std::atomic<bool> caller_waiting_{false};  // the dispatcher blocks on done_cv_
  std::atomic<bool> stop_{false};
  std::mutex wake_mu_;
  std::condition_variable wake_cv_;
  std::mutex done_mu_;
  std::condition_variable done_cv_;
  std::mutex dispatch_mu_;  // one job at a time when several threads share the pool
};

// Threads to use by default: the METRALE_THREADS environment variable when set (an integer
// in [1, 1024], anything else throws metrale::Error), otherwise the number of physical
// cores this process may run on (hyper-thread siblings share one core's load/FMA ports, so
// a memory-bound decode gains nothing from them).
int default_thread_count();

}  // namespace metrale
