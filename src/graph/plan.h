#pragma once
// The memory plan of a graph: every buffer the graph does not take from its caller gets a
// fixed byte offset in one arena, sized for passes of up to max_rows rows. Buffers whose
// lifetimes (first to last node touching them) overlap never share bytes; the others do, so
// the arena holds what is live at once, not the sum of all (ExecuTorch's memory planning).
// Rows start 64-byte aligned and strides are padded to 16 floats (kRows buffers), as the
// kernels were tested with.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "graph/graph.h"

namespace metrale {

// Floats per row of a kRows buffer of `width` columns: padded to 16 (64-byte aligned rows).
inline int64_t padded_cols(int64_t width) { return (width + 15) / 16 * 16; }

struct GraphPlan {
  int64_t max_rows = 0;
  std::vector<int64_t> offset;  // [buffers] bytes from the arena's start (-1: external)
  std::vector<int64_t> stride;  // [buffers] elements from one row to the next
  std::vector<int64_t> bytes;   // [buffers] bytes reserved (0: external or never used)
  size_t arena_bytes = 0;
  // Bytes the buffers would take without sharing (what the plan saves, for `inspect`).
  size_t unshared_bytes = 0;
};

GraphPlan plan_graph(const Graph& graph, int64_t max_rows);

}  // namespace metrale
