#pragma once
// What the scheduler tests read off a ServeStream: drain() collects its events until the end
// (at most a minute; a stream that never ends is a test failure), settled() waits for the
// scheduler to go idle; expect_a_request_may_turn_it_off() is the per-request speculation
// switch's check for any proposer.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "serve/scheduler.h"

namespace metrale::serve_test {

struct Drained {
  std::vector<int32_t> tokens;
  std::string text;
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
      d.text += e.text;
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

// A request that sends `speculative: false` drafts nothing on a scheduler that speculates with
// `spec`, and its tokens equal the same request's with drafts.
inline void expect_a_request_may_turn_it_off(Model& model, const SpeculationOptions& spec,
                                             ServeRequest r) {
  Scheduler sched(model, {.max_seqs = 2, .speculation = spec});
  r.speculative = false;
  const Drained off = drain(*sched.submit(r));
  EXPECT_FALSE(off.usage.speculative);
  EXPECT_EQ(off.usage.draft_tokens, 0);
  r.speculative = true;
  const Drained on = drain(*sched.submit(r));
  EXPECT_TRUE(on.usage.speculative);
  EXPECT_GT(on.usage.draft_tokens, 0);
  EXPECT_EQ(on.tokens, off.tokens);
}

}  // namespace metrale::serve_test
