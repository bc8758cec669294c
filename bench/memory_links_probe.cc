// What state the host's memory system is in for this VM's two vCPUs, measured with no metrale
// code: the read bandwidth of one thread, then of two threads at once (each pinned to its own
// CPU, each reading its half of a 512 MiB buffer on 2 MiB pages), and the FMA throughput of
// two threads over one (whether the two vCPUs are separate cores). On the shared 2-vCPU Zen
// 4 / Zen 5 guests docs/performance.md measures, the two-thread read bandwidth switches over
// time between about one thread's (the vCPUs share one path to memory) and about twice it;
// batch-1 decode at 2 threads follows it (docs/performance.md, "Why two threads are fast or
// slow"). Prints one JSON object.
//
//   bench/memory_links_probe [--reps N]   (built by bench/compare/decode_states.py)
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <immintrin.h>

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

float sink;  // keeps the reads and the FMAs from being optimised away

// GB/s reading [p, p + n) twice with four independent AVX-512 accumulators.
double read_gbs(const char* p, size_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  const double t0 = now();
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < n; i += 256) {
      a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
      a1 = _mm512_add_ps(a1, _mm512_load_ps(p + i + 64));
      a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 128));
      a3 = _mm512_add_ps(a3, _mm512_load_ps(p + i + 192));
    }
  }
  const double dt = now() - t0;
  sink += _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  return 2.0 * static_cast<double>(n) / dt / 1e9;
}

// GFLOP/s of eight independent FMA chains.
double fma_gflops(long iters) {
  __m512 a[8];
  for (__m512& x : a) x = _mm512_set1_ps(1.0f);
  const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  const double t0 = now();
  for (long i = 0; i < iters; ++i) {
    for (__m512& x : a) x = _mm512_fmadd_ps(x, b, c);
  }
  const double dt = now() - t0;
  __m512 s = a[0];
  for (int k = 1; k < 8; ++k) s = _mm512_add_ps(s, a[k]);
  sink += _mm512_reduce_add_ps(s);
  return static_cast<double>(iters) * 8 * 16 * 2 / dt / 1e9;
}

struct Job {
  int cpu = 0;
  bool fma = false;
  const char* p = nullptr;
  size_t n = 0;
  double result = 0;
};

void* run_job(void* arg) {
  auto* j = static_cast<Job*>(arg);
  pin(j->cpu);
  j->result = j->fma ? fma_gflops(50'000'000) : read_gbs(j->p, j->n);
  return nullptr;
}

// Sum over `threads` jobs run at once (thread i on CPU i).
double together(int threads, bool fma, const char* buf, size_t bytes) {
  std::vector<Job> jobs(static_cast<size_t>(threads));
  std::vector<pthread_t> ts(jobs.size());
  for (int i = 0; i < threads; ++i) {
    jobs[i] = {i, fma, buf + i * (bytes / threads), bytes / threads, 0};
    pthread_create(&ts[i], nullptr, run_job, &jobs[i]);
  }
  double sum = 0;
  for (int i = 0; i < threads; ++i) {
    pthread_join(ts[i], nullptr);
    sum += jobs[i].result;
  }
  return sum;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: memory_links_probe [--reps N]\n");
      return 2;
    }
  }
  if (reps < 1) reps = 1;
  constexpr size_t kBytes = size_t{512} << 20;
  void* mem = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  madvise(mem, kBytes, MADV_HUGEPAGE);
  auto* buf = static_cast<char*>(mem);
  std::memset(buf, 1, kBytes);
  std::vector<double> bw1, bw2, fma_ratio;
  for (int r = 0; r < reps; ++r) {
    bw1.push_back(together(1, false, buf, kBytes));
    bw2.push_back(together(2, false, buf, kBytes));
    fma_ratio.push_back(together(2, true, buf, kBytes) / together(1, true, buf, kBytes));
  }
  const double b1 = median(bw1), b2 = median(bw2);
  std::printf(
      "{\"read_gbs_1\": %.2f, \"read_gbs_2\": %.2f, \"read_scaling\": %.3f, "
      "\"fma_scaling\": %.3f, \"reps\": %d, \"sink\": %g}\n",
      b1, b2, b2 / b1, median(fma_ratio), reps, static_cast<double>(sink != 0.0f));
  return 0;
}
