#pragma once
// A STREAM-like read probe: how fast this machine streams memory into the cores, measured
// on the spot so roofline figures use this run's bandwidth, not a datasheet's.
#include <cstddef>

namespace metrale {

class ThreadPool;

struct BandwidthResult {
  double gb_per_s = 0;  // best of the repetitions, 1e9 bytes per second
  size_t bytes = 0;     // buffer size read per repetition
};

// Sums a buffer of `bytes` (far larger than the last-level cache) with independent
// accumulator streams on every thread of `pool`; best of `reps`.
BandwidthResult measure_read_bandwidth(ThreadPool& pool, size_t bytes = size_t{1} << 30, int reps = 5);

}  // namespace metrale
