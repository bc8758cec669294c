#pragma once
// What the scheduler tests read off a ServeStream: drain() collects its events until the end
// (at most a minute; a stream that never ends is a test failure), settled() waits for the
// scheduler to go idle.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "serve/scheduler.h"

namespace metrale::serve_test {

struct Drained {
  std::vector<int32_t> tokens;
  std::vector<float> embedding;
  FinishReason finish = FinishReason::kError;
  std::string error;
  ServeUsage usage;
};

inline Drained drain(ServeStream& s) {
  using namespace std::chrono_literals;
  Drained d;
  const auto give_up = std::chrono::steady_clock::now() + 60s;
  std::vector<ServeEvent> events;
  while (std::chrono::steady_clock::now() < give_up) {
    events.clear();
    if (!s.next(events, 100ms)) continue;
    for (ServeEvent& e : events) {
      d.tokens.insert(d.tokens.end(), e.tokens.begin(), e.tokens.end());
      if (!e.done) continue;
      d.embedding = std::move(e.embedding);
      d.finish = e.finish;
      d.error = e.error;
      d.usage = e.usage;
      return d;
    }
  }
  ADD_FAILURE() << "stream " << s.id() << " never finished";
  return d;
}

inline SchedulerStats settled(const Scheduler& sched) {
  using namespace std::chrono_literals;
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  SchedulerStats st = sched.stats();
  while ((st.running != 0 || st.waiting != 0) && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(2ms);
    st = sched.stats();
  }
  return st;
}

}  // namespace metrale::serve_test
