#include "core/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "core/error.h"

namespace metrale {
namespace {

// True while this thread runs a chunk of some pool's job; a parallel_for issued then runs
// inline instead of waiting on workers that may be the very thread asking.
thread_local bool tl_in_job = false;

class InJobScope {
 public:
  InJobScope() : saved_(std::exchange(tl_in_job, true)) {}
  ~InJobScope() { tl_in_job = saved_; }
  InJobScope(const InJobScope&) = delete;
  InJobScope& operator=(const InJobScope&) = delete;

 private:
  bool saved_;
};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Polls `done` for up to `spin_us` microseconds; true if it became true meanwhile.
template <typename Done>
bool spin_until(int spin_us, Done&& done) {
  if (spin_us <= 0) return done();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return done();
  }
}

}  // namespace

ThreadPool::ThreadPool(int n_threads, int spin_us) : n_threads_(n_threads), spin_us_(spin_us) {
  METRALE_CHECK(n_threads >= 1, "ThreadPool: expected at least 1 thread, found ", n_threads);
  METRALE_CHECK(spin_us >= 0, "ThreadPool: spin time must be >= 0 us, found ", spin_us);
  errors_.resize(static_cast<size_t>(n_threads));
  workers_.reserve(static_cast<size_t>(n_threads - 1));
  for (int t = 1; t < n_threads; ++t) workers_.emplace_back([this, t] { worker_loop(t); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    stop_.store(true);
  }
  wake_cv_.notify_all();
  for (std::thread& w : workers_) w.join();
}

void ThreadPool::chunk_range(size_t n, int n_chunks, int t, size_t* begin, size_t* end) {
  const auto chunks = static_cast<size_t>(n_chunks);
  const auto i = static_cast<size_t>(t);
  const size_t base = n / chunks;
  const size_t extra = n % chunks;
  *begin = i * base + std::min(i, extra);
  *end = *begin + base + (i < extra ? 1 : 0);
}

void ThreadPool::run(size_t n, Thunk thunk, void* fn, size_t grain) {
  if (n == 0) return;
  if (n_threads_ == 1 || n == 1 || tl_in_job || (grain > 0 && grain >= n))
    return run_inline(n, thunk, fn);

  std::lock_guard<std::mutex> dispatch(dispatch_mu_);
  thunk_ = thunk;
  fn_ = fn;
  n_ = n;
  grain_ = grain;
  next_.store(0, std::memory_order_relaxed);
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  // seq_cst pairs with the workers' sleepers_ increment: either a worker sees the new epoch
  // before sleeping, or we see it asleep and wake it.
  epoch_.fetch_add(1);
  if (sleepers_.load() > 0) {
    { std::lock_guard<std::mutex> lock(wake_mu_); }
    wake_cv_.notify_all();
  }
  run_chunk(0);
  wait_for_workers();

  std::exception_ptr first;
  for (std::exception_ptr& e : errors_) {
    if (e && !first) first = e;
    e = nullptr;
  }
  if (first) std::rethrow_exception(first);
}

void ThreadPool::run_inline(size_t n, Thunk thunk, void* fn) {
  InJobScope scope;
  for (int t = 0; t < n_threads_; ++t) {
    size_t begin, end;
    chunk_range(n, n_threads_, t, &begin, &end);
    if (begin < end) thunk(fn, begin, end, t);
  }
}

void ThreadPool::run_chunk(int t) {
  InJobScope scope;
  try {
    if (grain_ > 0) {
      for (;;) {
        const size_t begin = next_.fetch_add(grain_, std::memory_order_relaxed);
        if (begin >= n_) break;
        thunk_(fn_, begin, std::min(n_, begin + grain_), t);
      }
      return;
    }
    size_t begin, end;
    chunk_range(n_, n_threads_, t, &begin, &end);
    if (begin < end) thunk_(fn_, begin, end, t);
  } catch (...) {
    errors_[static_cast<size_t>(t)] = std::current_exception();
  }
}

void ThreadPool::wait_for_workers() {
  auto done = [this] { return pending_.load(std::memory_order_acquire) == 0; };
  if (spin_until(spin_us_, done)) return;
  std::unique_lock<std::mutex> lock(done_mu_);
  caller_waiting_.store(true);
  done_cv_.wait(lock, [this] { return pending_.load() == 0; });
  caller_waiting_.store(false);
}

void ThreadPool::worker_loop(int t) {
  uint32_t seen = 0;
  for (;;) {
    auto woken = [&] {
      return epoch_.load(std::memory_order_acquire) != seen ||
             stop_.load(std::memory_order_relaxed);
    };
    if (!spin_until(spin_us_, woken)) {
      std::unique_lock<std::mutex> lock(wake_mu_);
      sleepers_.fetch_add(1);
      wake_cv_.wait(lock, [&] { return epoch_.load() != seen || stop_.load(); });
      sleepers_.fetch_sub(1);
    }
    if (stop_.load()) return;
    // The dispatcher waits for every worker before the next job, so the epoch moved by one.
    seen = epoch_.load(std::memory_order_acquire);
    run_chunk(t);
    if (pending_.fetch_sub(1) == 1 && caller_waiting_.load()) {
      { std::lock_guard<std::mutex> lock(done_mu_); }
      done_cv_.notify_one();
    }
  }
}

namespace {

// Physical cores among the CPUs this process may run on: distinct (package, core) pairs of
// sysfs topology. 0 when the topology cannot be read.
int physical_cores_in_affinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
  std::set<std::pair<int, int>> cores;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    int package = -1, core = -1;
    std::ifstream(dir + "physical_package_id") >> package;
    std::ifstream(dir + "core_id") >> core;
    if (package < 0 || core < 0) return CPU_COUNT(&set);  // no topology: count CPUs
    cores.emplace(package, core);
  }
  return static_cast<int>(cores.size());
}

}  // namespace

int default_thread_count() {
  constexpr int kMaxThreads = 1024;
  if (const char* env = std::getenv("METRALE_THREADS"); env != nullptr) {
    const std::string_view s(env);
    int value = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    METRALE_CHECK(
        ec == std::errc() && end == s.data() + s.size() && value >= 1 && value <= kMaxThreads,
        "METRALE_THREADS: expected an integer in [1, ", kMaxThreads, "], found '", s, "'");
    return value;
  }
  if (const int cores = physical_cores_in_affinity(); cores > 0) return cores;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(std::min<unsigned>(hw, kMaxThreads)) : 1;
}

}  // namespace metrale
