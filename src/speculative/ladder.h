#pragma once
// How many drafts at which batch size. A verify step of k rows costs about one decode step
// only while decode is memory-bound; with many sequences active the step turns compute-bound
// and rejected rows cost real time (llama.cpp's lookup decoding measured 1.10x at 1 slot but
// 0.77x at 8). The ladder turns drafts down as the batch grows:
//   "4:3,8:3,16:1,32:1"  — rungs n_max:drafts; the first rung whose n_max >= the number of
//                          active sequences gives the draft count, past the last rung the
//                          last rung does.
// Each rung's drafts are clamped to 1..num_drafts (the --draft-tokens K the run allows), except
// an explicit 0: no drafts at that width, so "4:3,8:3,16:0" turns speculation off from 9
// sequences on. One draft per stream still loses where a step of 2x the rows is compute-bound
// (docs/performance.md measures 0.81-0.97x at batch 16 with "16:1"); a stream given 0 decodes
// its one row, and an MTP drafter only records that row, computing it in its next pass.
// Independently, the dispatch cap (1..128, default 32) bounds the draft rows one verify step
// adds over all its sequences; fit_dispatch_cap shares it out.
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace metrale::speculative {

inline constexpr int64_t kDefaultDispatchCap = 32;
inline constexpr int64_t kMaxDispatchCap = 128;

struct LadderRung {
  int64_t n_max = 0;   // active sequences up to this many use `drafts`
  int64_t drafts = 0;  // after clamping to 1..num_drafts (0 stays 0: no drafts)
};

class DraftLadder {
 public:
  // One rung: num_drafts at every batch size (no --draft-ladder given).
  static DraftLadder constant(int64_t num_drafts);
  // Parses a spec; errors name `flag`, the rung (1-based) and its text. n_max must be a
  // positive integer, strictly increasing rung to rung; drafts a non-negative integer.
  static DraftLadder parse(std::string_view spec, int64_t num_drafts,
                           std::string_view flag = "--draft-ladder");

  // Drafts per sequence when `active` sequences (>= 0) share the step.
  int64_t drafts_for(int64_t active) const;
  std::span<const LadderRung> rungs() const { return rungs_; }
  int64_t num_drafts() const { return num_drafts_; }

 private:
  std::vector<LadderRung> rungs_;
  int64_t num_drafts_ = 1;
};

// Checks a dispatch cap (1..128) and that the run's draft count fits under it; errors name
// the flags.
void check_dispatch_cap(int64_t cap, int64_t num_drafts,
                        std::string_view cap_flag = "--dispatch-cap",
                        std::string_view drafts_flag = "--draft-tokens");

// Lowers `drafts` (per sequence, in step order) so they sum to at most `cap`: the most even
// share (each gets min(want, level) for the highest level that fits, the rows left over go one
// each to the first sequences still short). Deterministic; never raises a count.
void fit_dispatch_cap(std::span<int64_t> drafts, int64_t cap);

}  // namespace metrale::speculative
