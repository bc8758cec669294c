// StatePool and plan_state_reserve (engine/state_pool.h): the block layout, the ring-depth
// ladder against budgets, the plan == allocation property, slot ownership, and the blocks'
// placement and zeroing. The numbers of the real Qwen3-Next-80B shape are worked out by hand.
#include "engine/state_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/factory/backend_factory.h"
#include "core/thread_pool.h"
#include "io/config/model_config.h"
#include "support/test_support.h"

namespace metrale {
namespace {

using test::error_of;

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Qwen3-Next-80B-A3B (tests/data/configs/qwen3_next/config.json): 48 layers, every 4th full
// attention, linear: 16 key heads x 128, 32 value heads x 128, conv kernel 4.
//   conv: (4 - 1) * (2 * 16 * 128 + 32 * 128) = 3 * 8192 = 24576 elements
//   ssm:  32 * 128 * 128 = 524288 elements
//   f32: conv 98304 + ssm 2097152 = 2195456 bytes per layer (both multiples of 64),
//        36 layers: 79036416 bytes per block (75.375 MiB)
//   f16: 49152 + 1048576 = 1097728 bytes per layer, 39518208 per block
constexpr int64_t kNextConv = 24576, kNextSsm = 524288;
constexpr size_t kNextBlockF32 = 79036416, kNextBlockF16 = 39518208;

ModelConfig qwen3_next() { return load_model_config("tests/data/configs/qwen3_next"); }

std::vector<LayerStateShape> next_shapes() { return linear_state_shapes(qwen3_next()); }

class StatePoolTest : public ::testing::Test {
 protected:
  ThreadPool threads_{1};
  std::unique_ptr<Backend> backend_ = make_backend({.device = "cpu", .pool = &threads_});
};

// A small layout: 3 layers, the middle one attention; odd element counts so the alignment
// shows: conv 3 x 4 = 12 bytes at 0, ssm 10 x 4 = 40 bytes at 64, layer 2 conv at 128,
// ssm at 192, end 232 -> block 256.
StateLayout small_layout(DType dtype = DType::kF32) {
  const std::vector<LayerStateShape> shapes = {{3, 10}, {0, 0}, {3, 10}};
  return layout_states(shapes, dtype);
}

// --- linear_state_shapes ---

TEST(LinearStateShapes, Qwen3NextLinearLayersOnly) {
  const ModelConfig c = qwen3_next();
  const std::vector<LayerStateShape> shapes = linear_state_shapes(c);
  ASSERT_EQ(48u, shapes.size());
  int64_t linear = 0;
  for (int64_t i = 0; i < 48; ++i) {
    const LayerStateShape& s = shapes[static_cast<size_t>(i)];
    if ((i + 1) % 4 == 0) {  // full_attention_interval 4: layers 3, 7, ..., 47
      EXPECT_EQ(LayerKind::kFullAttention, c.layer_kind(i)) << i;
      EXPECT_EQ(0, s.conv_elems) << i;
      EXPECT_EQ(0, s.ssm_elems) << i;
    } else {
      ++linear;
      EXPECT_EQ(kNextConv, s.conv_elems) << i;
      EXPECT_EQ(kNextSsm, s.ssm_elems) << i;
    }
  }
  EXPECT_EQ(36, linear);
}

TEST(LinearStateShapes, AttentionOnlyModelHasNone) {
  const ModelConfig c = load_model_config("tests/data/configs/qwen3");
  const std::vector<LayerStateShape> shapes = linear_state_shapes(c);
  ASSERT_EQ(static_cast<size_t>(c.n_layers), shapes.size());
  for (const LayerStateShape& s : shapes) {
    EXPECT_EQ(0, s.conv_elems);
    EXPECT_EQ(0, s.ssm_elems);
  }
  EXPECT_EQ(0u, layout_states(shapes, DType::kF32).block_bytes);
}

TEST(LinearStateShapes, KernelOfOneIsRejected) {
  const std::vector<uint8_t> bytes = test::read_file("tests/data/configs/qwen3_next/config.json");
  std::string json(bytes.begin(), bytes.end());
  const std::string key = "\"linear_conv_kernel_dim\": 4";
  ASSERT_NE(std::string::npos, json.find(key));
  json.replace(json.find(key), key.size(), "\"linear_conv_kernel_dim\": 1");
  const ModelConfig c = parse_model_config(json, "next.json");
  const std::string msg = error_of([&] { linear_state_shapes(c); });
  EXPECT_TRUE(has(msg, "next.json: linear_conv_kernel_dim: expected at least 2")) << msg;
  EXPECT_TRUE(has(msg, "found 1")) << msg;
}

// --- layout_states ---

TEST(StateLayout, Qwen3NextF32AndF16) {
  const std::vector<LayerStateShape> shapes = next_shapes();
  for (const auto& [dtype, conv_bytes, ssm_bytes, block] :
       {std::tuple{DType::kF32, size_t{98304}, size_t{2097152}, kNextBlockF32},
        std::tuple{DType::kF16, size_t{49152}, size_t{1048576}, kNextBlockF16}}) {
    const StateLayout l = layout_states(shapes, dtype);
    EXPECT_EQ(dtype, l.dtype);
    EXPECT_EQ(block, l.block_bytes);
    EXPECT_EQ(36, l.n_state_layers());
    ASSERT_EQ(48u, l.layers.size());
    size_t at = 0;  // every size is a multiple of 64, so the states lie back to back
    for (size_t i = 0; i < 48; ++i) {
      const StateLayout::Layer& layer = l.layers[i];
      EXPECT_EQ((i + 1) % 4 != 0, layer.has_state) << i;
      if (!layer.has_state) continue;
      EXPECT_EQ(at, layer.conv_offset) << i;
      EXPECT_EQ(conv_bytes, layer.conv_bytes) << i;
      EXPECT_EQ(at + conv_bytes, layer.ssm_offset) << i;
      EXPECT_EQ(ssm_bytes, layer.ssm_bytes) << i;
      at += conv_bytes + ssm_bytes;
    }
    EXPECT_EQ(block, at);
  }
}

TEST(StateLayout, EachStateStartsOn64Bytes) {
  const StateLayout f32 = small_layout(DType::kF32);
  EXPECT_EQ(0u, f32.layers[0].conv_offset);
  EXPECT_EQ(12u, f32.layers[0].conv_bytes);
  EXPECT_EQ(64u, f32.layers[0].ssm_offset);
  EXPECT_EQ(40u, f32.layers[0].ssm_bytes);
  EXPECT_FALSE(f32.layers[1].has_state);
  EXPECT_EQ(128u, f32.layers[2].conv_offset);
  EXPECT_EQ(192u, f32.layers[2].ssm_offset);
  EXPECT_EQ(256u, f32.block_bytes);  // 232 rounded up

  // f16: conv 6 bytes at 0, ssm 20 at 64, layer 2 at 128 / 192, end 212 -> 256.
  const StateLayout f16 = small_layout(DType::kF16);
  EXPECT_EQ(6u, f16.layers[0].conv_bytes);
  EXPECT_EQ(64u, f16.layers[0].ssm_offset);
  EXPECT_EQ(20u, f16.layers[2].ssm_bytes);
  EXPECT_EQ(192u, f16.layers[2].ssm_offset);
  EXPECT_EQ(256u, f16.block_bytes);

  // One state ending exactly on a boundary adds no padding: 16 f32 = 64 bytes.
  const std::vector<LayerStateShape> exact = {{16, 16}};
  EXPECT_EQ(128u, layout_states(exact, DType::kF32).block_bytes);
}

TEST(StateLayout, RejectsOtherDtypesNegativeShapesAndOverflow) {
  const std::vector<LayerStateShape> shapes = {{3, 10}};
  for (DType d : {DType::kBF16, DType::kF8E4M3, DType::kI32, DType::kF64}) {
    const std::string msg = error_of([&] { layout_states(shapes, d); });
    EXPECT_TRUE(has(msg, "is not a state storage type (expected f32 or f16)")) << msg;
    EXPECT_TRUE(has(msg, std::string(dtype_name(d)))) << msg;
  }
  const std::vector<LayerStateShape> negative = {{0, 0}, {3, -1}};
  std::string msg = error_of([&] { layout_states(negative, DType::kF32); });
  EXPECT_TRUE(has(msg, "layer 1: negative state shape (conv 3, ssm -1 elements)")) << msg;

  const int64_t huge = std::numeric_limits<int64_t>::max();
  const std::vector<LayerStateShape> big = {{huge, 1}};
  msg = error_of([&] { layout_states(big, DType::kF32); });
  EXPECT_TRUE(has(msg, "layer 0 conv state of 9223372036854775807 elements overflows")) << msg;
  const std::vector<LayerStateShape> sum = {{huge / 4, 0}, {huge / 4, huge / 4}};
  msg = error_of([&] { layout_states(sum, DType::kF32); });
  EXPECT_TRUE(has(msg, "overflows size_t")) << msg;
}

// --- plan_state_reserve ---

TEST(StateReserve, Qwen3NextNoBudgetTakesDepth8) {
  const StateLayout l = layout_states(next_shapes(), DType::kF32);
  const StateReservePlan p =
      plan_state_reserve({.max_seqs = 8, .block_bytes = l.block_bytes, .snapshot_slots = 0});
  EXPECT_EQ(8, p.max_seqs);
  EXPECT_EQ(9, p.slots);
  EXPECT_EQ(8, p.ring_depth);
  EXPECT_EQ(9, p.versions);
  EXPECT_FALSE(p.forced);
  EXPECT_EQ(kNextBlockF32, p.block_bytes);
  EXPECT_EQ(711327744u, p.slot_bytes);  // 9 x 79036416
  EXPECT_EQ(0u, p.snapshot_bytes);
  EXPECT_EQ(6401949696u, p.total_bytes);  // 9 x 9 x 79036416 (5.96 GiB)
  // Every ladder entry is listed, with its total.
  ASSERT_EQ(5u, p.tried.size());
  const std::pair<int64_t, uint64_t> want[] = {{8, 81 * uint64_t{kNextBlockF32}},
                                               {4, 45 * uint64_t{kNextBlockF32}},
                                               {2, 27 * uint64_t{kNextBlockF32}},
                                               {1, 18 * uint64_t{kNextBlockF32}},
                                               {0, 9 * uint64_t{kNextBlockF32}}};
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(want[i], p.tried[i]) << i;
}

TEST(StateReserve, Qwen3NextF16WithSnapshots) {
  const StateLayout l = layout_states(next_shapes(), DType::kF16);
  const StateReservePlan p =
      plan_state_reserve({.max_seqs = 1, .block_bytes = l.block_bytes, .snapshot_slots = 4});
  EXPECT_EQ(2, p.slots);  // one sequence + the dummy
  EXPECT_EQ(8, p.ring_depth);
  EXPECT_EQ(355663872u, p.slot_bytes);      // 9 x 39518208
  EXPECT_EQ(158072832u, p.snapshot_bytes);  // 4 x 39518208
  EXPECT_EQ(869400576u, p.total_bytes);     // 2 x 355663872 + 158072832 = 22 blocks
}

// With slots 9 and 2 snapshots the totals are (9 (d + 1) + 2) blocks of 79036416 bytes:
//   d = 8: 83 blocks = 6560022528   d = 4: 47 = 3714711552   d = 2: 29 = 2292056064
//   d = 1: 20 blocks = 1580728320   d = 0: 11 =  869400576
TEST(StateReserve, LadderAtBudgetsStraddlingEachDepth) {
  const struct {
    int64_t depth;
    uint64_t total;
  } rungs[] = {
      {8, 6560022528u}, {4, 3714711552u}, {2, 2292056064u}, {1, 1580728320u}, {0, 869400576u}};
  const auto plan = [](uint64_t budget) {
    return plan_state_reserve(
        {.max_seqs = 8, .block_bytes = kNextBlockF32, .snapshot_slots = 2, .budget = budget});
  };
  for (size_t i = 0; i < std::size(rungs); ++i) {
    // Exactly the total: this depth fits.
    StateReservePlan p = plan(rungs[i].total);
    EXPECT_EQ(rungs[i].depth, p.ring_depth) << rungs[i].total;
    EXPECT_EQ(rungs[i].total, p.total_bytes);
    EXPECT_EQ(rungs[i].depth + 1, p.versions);
    ASSERT_EQ(5u, p.tried.size());
    for (size_t j = 0; j < 5; ++j) EXPECT_EQ(rungs[j].total, p.tried[j].second) << j;
    // One byte more: still this depth. One byte less: the next one down (or nothing).
    EXPECT_EQ(rungs[i].depth, plan(rungs[i].total + 1).ring_depth);
    if (i + 1 < std::size(rungs)) {
      p = plan(rungs[i].total - 1);
      EXPECT_EQ(rungs[i + 1].depth, p.ring_depth);
      EXPECT_EQ(rungs[i + 1].total, p.total_bytes);
    }
  }
  EXPECT_EQ(8, plan(std::numeric_limits<uint64_t>::max()).ring_depth);
}

TEST(StateReserve, BudgetTooSmall) {
  const std::string msg = error_of([] {
    plan_state_reserve(
        {.max_seqs = 8, .block_bytes = kNextBlockF32, .snapshot_slots = 2, .budget = 869400575});
  });
  EXPECT_TRUE(has(msg,
                  "state reserve: 8 sequences + 1 padding dummy: 9 slots x 1 version x "
                  "79036416-byte blocks (75.4 MiB) + 2 snapshot blocks = 869400576 bytes "
                  "(829.1 MiB) exceed the budget of 869400575 bytes (829.1 MiB)"))
      << msg;
  EXPECT_TRUE(has(msg, "even with no rollback (ring depth 0)")) << msg;

  const std::string zero = error_of([] {
    plan_state_reserve({.max_seqs = 1, .block_bytes = 64, .snapshot_slots = 0, .budget = 0});
  });
  EXPECT_TRUE(has(zero, "1 sequence + 1 padding dummy: 2 slots x 1 version x 64-byte blocks"))
      << zero;
  EXPECT_TRUE(has(zero, "= 128 bytes (0.0 MiB) exceed the budget of 0 bytes")) << zero;
}

TEST(StateReserve, ForcedDepth) {
  // Depth 3 is not in the ladder; any depth >= 0 may be forced. 9 slots x 4 versions.
  StateReservePlan p = plan_state_reserve(
      {.max_seqs = 8, .block_bytes = kNextBlockF32, .snapshot_slots = 0, .ring_depth = 3});
  EXPECT_TRUE(p.forced);
  EXPECT_EQ(3, p.ring_depth);
  EXPECT_EQ(4, p.versions);
  EXPECT_EQ(36 * uint64_t{kNextBlockF32}, p.total_bytes);
  ASSERT_EQ(1u, p.tried.size());
  EXPECT_EQ(3, p.tried[0].first);

  // A forced depth is taken even when a deeper one would fit ...
  p = plan_state_reserve({.max_seqs = 8,
                          .block_bytes = kNextBlockF32,
                          .snapshot_slots = 0,
                          .budget = uint64_t{1} << 40,
                          .ring_depth = 0});
  EXPECT_EQ(0, p.ring_depth);
  EXPECT_EQ(9 * uint64_t{kNextBlockF32}, p.total_bytes);

  // ... and must itself fit.
  std::string msg = error_of([] {
    plan_state_reserve({.max_seqs = 8,
                        .block_bytes = kNextBlockF32,
                        .snapshot_slots = 0,
                        .budget = 36 * uint64_t{kNextBlockF32} - 1,
                        .ring_depth = 3});
  });
  EXPECT_TRUE(has(msg,
                  "state reserve: ring depth 3 (forced): 9 slots x 4 versions x "
                  "79036416-byte blocks"))
      << msg;
  EXPECT_TRUE(has(msg, "= 2845310976 bytes (2713.5 MiB) exceed the budget of 2845310975 bytes"))
      << msg;

  msg = error_of([] {
    plan_state_reserve({.max_seqs = 1, .block_bytes = 64, .snapshot_slots = 0, .ring_depth = -1});
  });
  EXPECT_TRUE(has(msg, "ring_depth: expected >= 0, found -1")) << msg;
}

TEST(StateReserve, MalformedRequests) {
  std::string msg = error_of([] { plan_state_reserve({.max_seqs = 0, .block_bytes = 64}); });
  EXPECT_TRUE(has(msg, "state reserve: max_seqs: expected at least 1, found 0")) << msg;
  msg = error_of([] { plan_state_reserve({.max_seqs = -3, .block_bytes = 64}); });
  EXPECT_TRUE(has(msg, "max_seqs: expected at least 1, found -3")) << msg;
  msg = error_of([] { plan_state_reserve({.max_seqs = 2147483647, .block_bytes = 64}); });
  EXPECT_TRUE(has(msg, "max_seqs: expected at most 2147483646, found 2147483647")) << msg;
  msg = error_of([] { plan_state_reserve({.max_seqs = 1, .block_bytes = 0}); });
  EXPECT_TRUE(has(msg, "state reserve: block_bytes: expected a positive size, found 0")) << msg;
  msg = error_of(
      [] { plan_state_reserve({.max_seqs = 1, .block_bytes = 64, .snapshot_slots = -1}); });
  EXPECT_TRUE(has(msg, "state reserve: snapshot_slots: expected >= 0, found -1")) << msg;
}

TEST(StateReserve, OverflowIsAnError) {
  // 2^31 slots x 9 versions x 2^32 bytes > 2^64.
  std::string msg = error_of(
      [] { plan_state_reserve({.max_seqs = 2147483646, .block_bytes = size_t{1} << 32}); });
  EXPECT_TRUE(has(msg,
                  "state reserve: 2147483647 slots x 8 + 1 versions x 4294967296-byte "
                  "blocks + 0 snapshot blocks overflows 64 bits"))
      << msg;
  // The snapshot term alone.
  msg = error_of([] {
    plan_state_reserve(
        {.max_seqs = 1, .block_bytes = size_t{1} << 40, .snapshot_slots = int64_t{1} << 30});
  });
  EXPECT_TRUE(has(msg, "overflows 64 bits")) << msg;
  // The sum of two terms that each fit.
  msg = error_of([] {
    plan_state_reserve(
        {.max_seqs = 1, .block_bytes = size_t{1} << 62, .snapshot_slots = 2, .ring_depth = 0});
  });
  EXPECT_TRUE(has(msg, "overflows 64 bits")) << msg;
  // A forced depth of INT64_MAX: versions overflow.
  msg = error_of([] {
    plan_state_reserve(
        {.max_seqs = 1, .block_bytes = 64, .ring_depth = std::numeric_limits<int64_t>::max()});
  });
  EXPECT_TRUE(has(msg, "overflows 64 bits")) << msg;
}

TEST(StateReserve, Describe) {
  const StateLayout l = layout_states(next_shapes(), DType::kF32);
  const StateReservePlan p = plan_state_reserve({.max_seqs = 8,
                                                 .block_bytes = l.block_bytes,
                                                 .snapshot_slots = 2,
                                                 .budget = uint64_t{3} << 30});
  const std::string d = describe(p, l);
  EXPECT_TRUE(has(d, "recurrent state: f32, 36 of 48 layers (0-2,4-6,8-10,")) << d;
  EXPECT_TRUE(has(d, "  per layer: conv 98304 + ssm 2097152 bytes\n")) << d;
  EXPECT_TRUE(has(d, "block (every layer's state after one token): 79036416 bytes (75.4 MiB)\n"))
      << d;
  EXPECT_TRUE(has(d, "slots: 9 (8 sequences + 1 padding dummy)\n")) << d;
  EXPECT_TRUE(has(d, "ring depth: 2 (3 versions per slot, 237109248 bytes (226.1 MiB))\n")) << d;
  EXPECT_TRUE(has(d, "  budget: 3221225472 bytes (3072.0 MiB)\n")) << d;
  EXPECT_TRUE(has(d, "  depth 8: 6560022528 bytes (6256.1 MiB), over budget\n")) << d;
  EXPECT_TRUE(has(d, "  depth 4: 3714711552 bytes (3542.6 MiB), over budget\n")) << d;
  EXPECT_TRUE(has(d, "  depth 2: 2292056064 bytes (2185.9 MiB)  <- chosen\n")) << d;
  EXPECT_TRUE(has(d, "  depth 0: 869400576 bytes (829.1 MiB)\n")) << d;
  EXPECT_TRUE(has(d, "snapshot slots: 2 (158072832 bytes (150.8 MiB))\n")) << d;
  EXPECT_TRUE(has(d, "total: 2292056064 bytes (2185.9 MiB)\n")) << d;

  // Layers of different shapes are listed one by one; no budget, a forced depth.
  const std::vector<LayerStateShape> mixed = {{3, 10}, {0, 0}, {5, 10}};
  const StateLayout ml = layout_states(mixed, DType::kF16);
  const StateReservePlan mp = plan_state_reserve(
      {.max_seqs = 1, .block_bytes = ml.block_bytes, .snapshot_slots = 0, .ring_depth = 1});
  const std::string md = describe(mp, ml);
  EXPECT_TRUE(has(md, "recurrent state: f16, 2 of 3 layers (0,2)\n")) << md;
  EXPECT_TRUE(has(md, "  layer 0: conv 6 + ssm 20 bytes\n  layer 2: conv 10 + ssm 20 bytes\n"))
      << md;
  EXPECT_TRUE(has(md, "ring depth: 1 (2 versions per slot, 512 bytes (0.0 MiB)), forced\n")) << md;
  EXPECT_TRUE(has(md, "  budget: none\n")) << md;
}

// --- parse_byte_size ---

TEST(ParseByteSize, UnitsAndErrors) {
  EXPECT_EQ(0u, parse_byte_size("0", "--budget"));
  EXPECT_EQ(1073741824u, parse_byte_size("1073741824", "--budget"));
  EXPECT_EQ(512u << 20, parse_byte_size("512MiB", "--budget"));
  EXPECT_EQ(uint64_t{2} << 30, parse_byte_size("2GiB", "--budget"));
  EXPECT_EQ(uint64_t{2} << 30, parse_byte_size("2gib", "--budget"));
  EXPECT_EQ(uint64_t{2} << 30, parse_byte_size("2G", "--budget"));
  EXPECT_EQ(uint64_t{2} << 30, parse_byte_size("2 GiB", "--budget"));
  EXPECT_EQ(1000000000u, parse_byte_size("1GB", "--budget"));
  EXPECT_EQ(64000u, parse_byte_size("64kB", "--budget"));
  EXPECT_EQ(65536u, parse_byte_size("64K", "--budget"));
  EXPECT_EQ(100u, parse_byte_size("100B", "--budget"));
  EXPECT_EQ(uint64_t{3} << 40, parse_byte_size("3TiB", "--budget"));
  EXPECT_EQ(std::numeric_limits<uint64_t>::max(),
            parse_byte_size("18446744073709551615", "--budget"));

  for (const char* bad : {"", "GiB", "-1", "1.5GiB", "2 XB", "12Mo", "1e9", " 5", "2GiBs"}) {
    const std::string msg = error_of([&] { parse_byte_size(bad, "--budget"); });
    EXPECT_TRUE(has(msg, "--budget: expected a byte count such as 1073741824, 512MiB")) << msg;
    EXPECT_TRUE(has(msg, std::string("found \"") + bad + "\"")) << msg;
  }
  EXPECT_TRUE(has(error_of([] { parse_byte_size("1.5GiB", "--budget"); }), "1536MiB"));
  EXPECT_TRUE(has(error_of([] { parse_byte_size("2 XB", "--budget"); }), "unknown unit \"xb\""));
  EXPECT_TRUE(has(error_of([] { parse_byte_size("18446744073709551616", "--budget"); }),
                  "more than 2^64 - 1 bytes"));
  EXPECT_TRUE(has(error_of([] { parse_byte_size("17179869184GiB", "--budget"); }),
                  "more than 2^64 - 1 bytes"));
}

// --- StatePool ---

TEST_F(StatePoolTest, AllocationEqualsPlanTotal) {
  const StateLayout small = small_layout();
  const StateLayout small16 = small_layout(DType::kF16);
  const std::vector<LayerStateShape> one = {{1, 1}};
  const StateLayout tiny = layout_states(one, DType::kF32);  // one 128-byte block
  const StateReserveRequest requests[] = {
      {.max_seqs = 1, .block_bytes = small.block_bytes},
      {.max_seqs = 3, .block_bytes = small.block_bytes, .snapshot_slots = 5},
      {.max_seqs = 7, .block_bytes = small.block_bytes, .budget = 7000},
      {.max_seqs = 2, .block_bytes = small.block_bytes, .ring_depth = 5},
      {.max_seqs = 64, .block_bytes = small16.block_bytes, .snapshot_slots = 1, .budget = 40000},
      {.max_seqs = 1, .block_bytes = tiny.block_bytes, .snapshot_slots = 0, .budget = 256},
  };
  const StateLayout* layouts[] = {&small, &small, &small, &small, &small16, &tiny};
  for (size_t i = 0; i < std::size(requests); ++i) {
    const StateReservePlan plan = plan_state_reserve(requests[i]);
    StatePool pool(*backend_, plan, *layouts[i]);
    EXPECT_EQ(plan.total_bytes, pool.allocated_bytes()) << i;
    EXPECT_EQ(plan.slots * plan.versions * static_cast<int64_t>(plan.block_bytes) +
                  plan.snapshot_slots * static_cast<int64_t>(plan.block_bytes),
              static_cast<int64_t>(pool.allocated_bytes()))
        << i;
    EXPECT_EQ(plan.max_seqs, pool.free_slots()) << i;
    EXPECT_EQ(plan.slots - 1, pool.dummy_slot()) << i;
  }
  // The 7000-byte budget: 8 slots x 256 bytes: depth 2 (6144) fits, depth 4 (10240) not.
  EXPECT_EQ(2, plan_state_reserve(requests[2]).ring_depth);
  // The 256-byte budget: 2 slots x 128 bytes, depth 0 only.
  EXPECT_EQ(0, plan_state_reserve(requests[5]).ring_depth);
}

TEST_F(StatePoolTest, RejectsAPlanThatDisagrees) {
  const StateLayout l = small_layout();
  const StateReservePlan good =
      plan_state_reserve({.max_seqs = 2, .block_bytes = l.block_bytes, .snapshot_slots = 1});

  StateReservePlan p = good;
  p.total_bytes += 64;
  std::string msg = error_of([&] { StatePool(*backend_, p, l); });
  EXPECT_TRUE(has(msg, "state pool: the plan's totals do not add up")) << msg;

  p = good;
  p.slots = 5;
  msg = error_of([&] { StatePool(*backend_, p, l); });
  EXPECT_TRUE(has(msg, "state pool: inconsistent plan (max_seqs 2, slots 5")) << msg;

  const std::vector<LayerStateShape> bigger = {{100, 100}};
  msg = error_of([&] { StatePool(*backend_, good, layout_states(bigger, DType::kF32)); });
  EXPECT_TRUE(has(msg, "state pool: the plan's block_bytes 256 differ from the layout's 896"))
      << msg;

  p = good;
  p.budget = good.total_bytes - 1;
  msg = error_of([&] { StatePool(*backend_, p, l); });
  EXPECT_TRUE(has(msg, "exceed its budget")) << msg;
}

TEST_F(StatePoolTest, AcquireReleaseAndOwnership) {
  const StateLayout l = small_layout();
  StatePool pool(*backend_, plan_state_reserve({.max_seqs = 2, .block_bytes = l.block_bytes}), l);
  int a = 0, b = 0, c = 0;  // three sequences' identities

  EXPECT_EQ(0, pool.acquire(&a));
  EXPECT_EQ(1, pool.acquire(&b));
  EXPECT_EQ(0, pool.free_slots());
  std::string msg = error_of([&] { pool.acquire(&c); });
  EXPECT_TRUE(has(msg, "state pool full: 2 slots in use (max_seqs 2)")) << msg;
  EXPECT_EQ(2, pool.dummy_slot());  // never handed out

  pool.check_owner(0, &a);
  pool.check_owner(1, &b);
  msg = error_of([&] { pool.check_owner(0, &b); });
  EXPECT_EQ("state slot 0 is held by another sequence", msg);
  msg = error_of([&] { pool.release(1, &a); });
  EXPECT_EQ("state pool: release: state slot 1 is held by another sequence", msg);
  msg = error_of([&] { pool.check_owner(2, &a); });
  EXPECT_EQ("state slot 2 is the padding dummy, held by no sequence", msg);
  msg = error_of([&] { pool.check_owner(3, &a); });
  EXPECT_EQ("state slot 3 is out of range [0, 3)", msg);
  msg = error_of([&] { pool.check_owner(-1, &a); });
  EXPECT_EQ("state slot -1 is out of range [0, 3)", msg);

  pool.release(0, &a);
  EXPECT_EQ(1, pool.free_slots());
  msg = error_of([&] { pool.check_owner(0, &a); });
  EXPECT_EQ("state slot 0 is free, not held by this sequence", msg);
  msg = error_of([&] { pool.release(0, &a); });  // a double release
  EXPECT_EQ("state pool: release: state slot 0 is free, not held by this sequence", msg);

  // One sequence, one slot; a null owner is no identity.
  msg = error_of([&] { pool.acquire(&b); });
  EXPECT_EQ("state pool: the sequence already holds state slot 1", msg);
  msg = error_of([&] { pool.acquire(nullptr); });
  EXPECT_EQ("state pool: acquire with a null owner", msg);

  EXPECT_EQ(0, pool.acquire(&c));  // the lowest free slot
  pool.check_owner(0, &c);
  pool.release(1, &b);
  pool.release(0, &c);
  EXPECT_EQ(2, pool.free_slots());
}

TEST_F(StatePoolTest, BlocksAreDistinctAlignedAndTileTheBuffer) {
  const StateLayout l = small_layout();
  const StateReservePlan plan = plan_state_reserve(
      {.max_seqs = 3, .block_bytes = l.block_bytes, .snapshot_slots = 2, .ring_depth = 2});
  StatePool pool(*backend_, plan, l);
  std::vector<std::byte*> blocks;
  for (int32_t s = 0; s < plan.slots; ++s) {
    for (int64_t v = 0; v < plan.versions; ++v) blocks.push_back(pool.block(s, v));
  }
  for (int64_t i = 0; i < plan.snapshot_slots; ++i) blocks.push_back(pool.snapshot_block(i));
  ASSERT_EQ(static_cast<size_t>(4 * 3 + 2), blocks.size());
  EXPECT_EQ(blocks.size(), std::set<std::byte*>(blocks.begin(), blocks.end()).size());
  std::vector<std::byte*> sorted = blocks;
  std::sort(sorted.begin(), sorted.end());
  const auto base = reinterpret_cast<uintptr_t>(sorted.front());
  EXPECT_EQ(0u, base % 64);
  for (size_t i = 0; i < sorted.size(); ++i) {
    // Back to back, so none overlaps another and the last ends where the buffer does.
    EXPECT_EQ(base + i * plan.block_bytes, reinterpret_cast<uintptr_t>(sorted[i])) << i;
  }
  EXPECT_EQ(plan.total_bytes, sorted.size() * plan.block_bytes);
  // Slot-major: a slot's versions are consecutive; the snapshots come after every slot.
  EXPECT_EQ(pool.block(1, 0) + plan.block_bytes, pool.block(1, 1));
  EXPECT_EQ(pool.block(0, 0) + plan.slot_bytes, pool.block(1, 0));
  EXPECT_EQ(pool.block(0, 0) + plan.slots * plan.slot_bytes, pool.snapshot_block(0));

  std::string msg = error_of([&] { pool.block(4, 0); });
  EXPECT_EQ("state pool: slot 4 is out of range [0, 4)", msg);
  msg = error_of([&] { pool.block(-1, 0); });
  EXPECT_EQ("state pool: slot -1 is out of range [0, 4)", msg);
  msg = error_of([&] { pool.block(0, 3); });
  EXPECT_EQ("state pool: version 3 is out of range [0, 3)", msg);
  msg = error_of([&] { pool.block(0, -1); });
  EXPECT_EQ("state pool: version -1 is out of range [0, 3)", msg);
  msg = error_of([&] { pool.snapshot_block(2); });
  EXPECT_EQ("state pool: snapshot 2 is out of range [0, 2)", msg);
  EXPECT_NO_THROW(pool.block(pool.dummy_slot(), 2));  // the dummy's blocks are real

  StatePool none(*backend_, plan_state_reserve({.max_seqs = 1, .block_bytes = l.block_bytes}), l);
  msg = error_of([&] { none.snapshot_block(0); });
  EXPECT_EQ("state pool: snapshot 0 is out of range [0, 0)", msg);
}

TEST_F(StatePoolTest, AcquireZeroesEveryVersionOfItsSlotOnly) {
  const StateLayout l = small_layout();
  const StateReservePlan plan = plan_state_reserve(
      {.max_seqs = 2, .block_bytes = l.block_bytes, .snapshot_slots = 1, .ring_depth = 4});
  StatePool pool(*backend_, plan, l);
  const auto all_equal = [&](const std::byte* b, std::byte value) {
    return std::all_of(b, b + plan.block_bytes, [&](std::byte x) { return x == value; });
  };
  // A fresh pool is zero everywhere.
  for (int32_t s = 0; s < plan.slots; ++s) {
    for (int64_t v = 0; v < plan.versions; ++v) EXPECT_TRUE(all_equal(pool.block(s, v), {}));
  }
  int a = 0, b = 0;
  ASSERT_EQ(0, pool.acquire(&a));
  ASSERT_EQ(1, pool.acquire(&b));
  // Dirty everything: every version of every slot (the dummy too) and the snapshot.
  for (int32_t s = 0; s < plan.slots; ++s) {
    for (int64_t v = 0; v < plan.versions; ++v)
      std::memset(pool.block(s, v), 0x5A + s, plan.block_bytes);
  }
  std::memset(pool.snapshot_block(0), 0x77, plan.block_bytes);

  pool.release(0, &a);
  EXPECT_TRUE(all_equal(pool.block(0, 3), std::byte{0x5A}));  // release does not touch it
  int c = 0;
  ASSERT_EQ(0, pool.acquire(&c));
  for (int64_t v = 0; v < plan.versions; ++v) EXPECT_TRUE(all_equal(pool.block(0, v), {})) << v;
  // The other sequence, the dummy and the snapshot keep their bytes.
  for (int64_t v = 0; v < plan.versions; ++v) {
    EXPECT_TRUE(all_equal(pool.block(1, v), std::byte{0x5B})) << v;
    EXPECT_TRUE(all_equal(pool.block(2, v), std::byte{0x5C})) << v;
  }
  EXPECT_TRUE(all_equal(pool.snapshot_block(0), std::byte{0x77}));
}

TEST_F(StatePoolTest, SnapshotCopyRoundTrip) {
  // Qwen3-Next's first 4 layers (3 with state), f16: a 3293184-byte block.
  const std::vector<LayerStateShape> shapes = next_shapes();
  const StateLayout l = layout_states(std::span(shapes).first(4), DType::kF16);
  ASSERT_EQ(3u * 1097728, l.block_bytes);
  const StateReservePlan plan = plan_state_reserve(
      {.max_seqs = 1, .block_bytes = l.block_bytes, .snapshot_slots = 2, .ring_depth = 1});
  StatePool pool(*backend_, plan, l);
  int seq = 0;
  const int32_t slot = pool.acquire(&seq);
  std::byte* live = pool.block(slot, 1);
  for (size_t i = 0; i < plan.block_bytes; ++i) live[i] = static_cast<std::byte>(i * 131 % 251);
  const std::vector<std::byte> want(live, live + plan.block_bytes);

  pool.copy_block(live, pool.snapshot_block(1), plan.block_bytes);  // save
  pool.zero_block(live);
  EXPECT_TRUE(
      std::all_of(live, live + plan.block_bytes, [](std::byte x) { return x == std::byte{}; }));
  pool.copy_block(pool.snapshot_block(1), pool.block(slot, 0), plan.block_bytes);  // restore
  EXPECT_EQ(0, std::memcmp(want.data(), pool.block(slot, 0), plan.block_bytes));
  EXPECT_EQ(0, std::memcmp(want.data(), pool.snapshot_block(1), plan.block_bytes));
  pool.copy_block(live, live, plan.block_bytes);  // a copy onto itself is a no-op
  // The untouched snapshot is still zero.
  const std::byte* s0 = pool.snapshot_block(0);
  EXPECT_TRUE(std::all_of(s0, s0 + plan.block_bytes, [](std::byte x) { return x == std::byte{}; }));

  // zero_block takes block starts of this pool only.
  std::string msg = error_of([&] { pool.zero_block(live + 64); });
  EXPECT_EQ("state pool: zero_block of a pointer that is not a block of this pool", msg);
  std::vector<std::byte> outside(plan.block_bytes);
  msg = error_of([&] { pool.zero_block(outside.data()); });
  EXPECT_EQ("state pool: zero_block of a pointer that is not a block of this pool", msg);
  pool.zero_block(pool.snapshot_block(1));
  EXPECT_TRUE(std::all_of(pool.snapshot_block(1), pool.snapshot_block(1) + plan.block_bytes,
                          [](std::byte x) { return x == std::byte{}; }));
}

}  // namespace
}  // namespace metrale
