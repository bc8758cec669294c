#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/error.h"

namespace metrale {
namespace {

TEST(ThreadPool, ChunkRangeIsABalancedPartition) {
  for (int chunks = 1; chunks <= 9; ++chunks) {
    for (size_t n = 0; n <= 200; ++n) {
      size_t expect_begin = 0;
      for (int t = 0; t < chunks; ++t) {
        size_t begin, end;
        ThreadPool::chunk_range(n, chunks, t, &begin, &end);
        ASSERT_EQ(begin, expect_begin) << n << " over " << chunks;
        ASSERT_LE(end - begin, n / static_cast<size_t>(chunks) + 1);
        ASSERT_GE(end - begin, n / static_cast<size_t>(chunks));
        expect_begin = end;
      }
      ASSERT_EQ(expect_begin, n);
    }
  }
}

TEST(ThreadPool, RejectsBadSizes) {
  EXPECT_THROW(ThreadPool(0), Error);
  EXPECT_THROW(ThreadPool(-2), Error);
  EXPECT_THROW(ThreadPool(2, -1), Error);
}

// Every index visited exactly once, by the chunk the static split assigns it.
TEST(ThreadPool, CoversEveryIndexOnceForManySizes) {
  for (int threads : {1, 2, 3, 4, 7}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    std::vector<size_t> sizes(70);
    std::iota(sizes.begin(), sizes.end(), 0);
    sizes.insert(sizes.end(), {127, 128, 1000, 4097, 100003});
    for (size_t n : sizes) {
      std::vector<int> owner(n, -1);
      std::vector<int> hits(n, 0);
      pool.parallel_for(n, [&](size_t begin, size_t end, int t) {
        ASSERT_LT(begin, end);
        ASSERT_GE(t, 0);
        ASSERT_LT(t, threads);
        size_t b, e;
        ThreadPool::chunk_range(n, threads, t, &b, &e);
        ASSERT_EQ(begin, b);
        ASSERT_EQ(end, e);
        for (size_t i = begin; i < end; ++i) {
          ++hits[i];
          owner[i] = t;
        }
      });
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i], 1) << "n=" << n << " i=" << i;
    }
  }
}

TEST(ThreadPool, CallerRunsChunkZero) {
  ThreadPool pool(4);
  const auto caller = std::this_thread::get_id();
  std::vector<std::thread::id> ids(4);
  pool.parallel_for(
      4, [&](size_t, size_t, int t) { ids[static_cast<size_t>(t)] = std::this_thread::get_id(); });
  EXPECT_EQ(ids[0], caller);
  for (int t = 1; t < 4; ++t) EXPECT_NE(ids[static_cast<size_t>(t)], caller);
}

// Per-chunk partial sums combined in chunk order give the same bits on every call.
TEST(ThreadPool, ReductionsAreDeterministic) {
  ThreadPool pool(3);
  std::vector<float> x(10007);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = 1.0f / static_cast<float>(i + 1) * ((i % 3) ? 1.f : -1.7f);
  auto reduce = [&] {
    std::vector<float> partial(3, 0.0f);
    pool.parallel_for(x.size(), [&](size_t b, size_t e, int t) {
      float s = 0;
      for (size_t i = b; i < e; ++i) s += x[i];
      partial[static_cast<size_t>(t)] = s;
    });
    return partial[0] + partial[1] + partial[2];
  };
  const float first = reduce();
  for (int rep = 0; rep < 200; ++rep) ASSERT_EQ(reduce(), first);
}

// Dynamic pieces: every index exactly once, in pieces of `grain` (the last one shorter),
// whatever thread claims them; grains at or above n, nesting and throwing included.
TEST(ThreadPool, DynamicPiecesCoverEveryIndexOnce) {
  for (int threads : {1, 2, 3, 7}) {
    ThreadPool pool(threads);
    for (size_t n :
         {size_t{0}, size_t{1}, size_t{2}, size_t{17}, size_t{128}, size_t{1000}, size_t{4097}}) {
      for (size_t grain : {size_t{1}, size_t{3}, size_t{64}, size_t{5000}}) {
        std::vector<std::atomic<int>> hits(n);
        pool.parallel_for_dynamic(n, grain, [&](size_t begin, size_t end, int t) {
          ASSERT_LT(begin, end);
          ASSERT_GE(t, 0);
          ASSERT_LT(t, threads);
          if (threads > 1 && grain < n) {
            ASSERT_EQ(begin % grain, 0u);
            ASSERT_EQ(end, std::min(n, begin + grain));
          }
          for (size_t i = begin; i < end; ++i) hits[i].fetch_add(1);
        });
        for (size_t i = 0; i < n; ++i)
          ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " grain=" << grain << " i=" << i;
      }
    }
  }
}

TEST(ThreadPool, DynamicPiecesPropagateExceptionsAndNest) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for_dynamic(100, 7,
                                         [](size_t b, size_t, int) {
                                           if (b == 49) throw std::runtime_error("piece failed");
                                         }),
               std::runtime_error);
  std::vector<int> hits(300, 0);
  pool.parallel_for(3, [&](size_t b, size_t e, int) {
    for (size_t c = b; c < e; ++c) {
      pool.parallel_for_dynamic(100, 9, [&](size_t ib, size_t ie, int) {
        for (size_t i = ib; i < ie; ++i) ++hits[c * 100 + i];
      });
    }
  });
  EXPECT_EQ(std::accumulate(hits.begin(), hits.end(), 0), 300);
}

TEST(ThreadPool, PropagatesExceptions) {
  ThreadPool pool(4);
  EXPECT_THROW(pool.parallel_for(100,
                                 [](size_t b, size_t, int) {
                                   if (b > 0) throw std::runtime_error("worker failed");
                                 }),
               std::runtime_error);
  // Chunk 0 is the caller's own.
  EXPECT_THROW(pool.parallel_for(100,
                                 [](size_t b, size_t, int) {
                                   if (b == 0) throw make_error("caller failed");
                                 }),
               Error);
  // The pool stays usable after a failure.
  std::vector<int> hits(1000, 0);
  pool.parallel_for(hits.size(), [&](size_t b, size_t e, int) {
    for (size_t i = b; i < e; ++i) ++hits[i];
  });
  EXPECT_EQ(std::accumulate(hits.begin(), hits.end(), 0), 1000);
}

TEST(ThreadPool, LowestThrowingChunkWins) {
  ThreadPool pool(4);
  for (int rep = 0; rep < 50; ++rep) {
    try {
      pool.parallel_for(4, [](size_t, size_t, int t) {
        if (t >= 1) throw std::runtime_error("chunk " + std::to_string(t));
      });
      FAIL() << "expected an exception";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "chunk 1");
    }
  }
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(3);
  std::vector<int> hits(30 * 50, 0);
  pool.parallel_for(30, [&](size_t b, size_t e, int) {
    for (size_t row = b; row < e; ++row) {
      pool.parallel_for(50, [&](size_t cb, size_t ce, int) {
        for (size_t c = cb; c < ce; ++c) ++hits[row * 50 + c];
      });
    }
  });
  for (int h : hits) ASSERT_EQ(h, 1);
}

// Many small jobs back to back, with workers that spin (the decode pattern) and with
// workers that go to sleep between jobs (the condition-variable path).
TEST(ThreadPool, ReuseUnderLoad) {
  for (int spin_us : {ThreadPool::kDefaultSpinUs, 0}) {
    ThreadPool pool(4, spin_us);
    std::vector<long> acc(64, 0);
    const int reps = spin_us == 0 ? 1000 : 3000;
    for (int rep = 0; rep < reps; ++rep) {
      pool.parallel_for(acc.size(), [&](size_t b, size_t e, int) {
        for (size_t i = b; i < e; ++i) acc[i] += static_cast<long>(i);
      });
    }
    for (size_t i = 0; i < acc.size(); ++i) ASSERT_EQ(acc[i], static_cast<long>(i) * reps);
  }
}

TEST(ThreadPool, SleepingWorkersWakeUp) {
  ThreadPool pool(3, 0);
  for (int rep = 0; rep < 5; ++rep) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // let the workers sleep
    std::vector<int> hits(9, 0);
    pool.parallel_for(9, [&](size_t b, size_t e, int) {
      for (size_t i = b; i < e; ++i) ++hits[i];
    });
    for (int h : hits) ASSERT_EQ(h, 1);
  }
}

TEST(ThreadPool, SharedByTwoOutsideThreads) {
  ThreadPool pool(3);
  auto work = [&](std::vector<int>* hits) {
    for (int rep = 0; rep < 500; ++rep) {
      pool.parallel_for(hits->size(), [&](size_t b, size_t e, int) {
        for (size_t i = b; i < e; ++i) ++(*hits)[i];
      });
    }
  };
  std::vector<int> a(37, 0), b(101, 0);
  std::thread other(work, &b);
  work(&a);
  other.join();
  for (int h : a) ASSERT_EQ(h, 500);
  for (int h : b) ASSERT_EQ(h, 500);
}

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(DefaultThreadCount, HonoursEnvironment) {
  {
    ScopedEnv env("METRALE_THREADS", nullptr);
    const int n = default_thread_count();
    EXPECT_GE(n, 1);
    EXPECT_LE(n, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  }
  {
    ScopedEnv env("METRALE_THREADS", "3");
    EXPECT_EQ(default_thread_count(), 3);
  }
  for (const char* bad : {"", "0", "-1", "abc", "3x", " 3", "2000", "99999999999"}) {
    ScopedEnv env("METRALE_THREADS", bad);
    EXPECT_THROW(default_thread_count(), Error) << "'" << bad << "'";
  }
}

TEST(DefaultThreadCount, ErrorNamesTheVariableAndValue) {
  ScopedEnv env("METRALE_THREADS", "many");
  try {
    default_thread_count();
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("METRALE_THREADS"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'many'"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace metrale
