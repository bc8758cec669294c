// RopeTable against HuggingFace transformers' own tables (tests/backend/data/rope_hf.json,
// written by tools/fixtures/rope_tables.py): inv_freq, attention scaling, cos and sin.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "layers/rope_table.h"

namespace metrale {
namespace {

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

RopeTableConfig config_of(const nlohmann::json& c) {
  const auto& r = c["rope"];
  RopeTableConfig cfg;
  const std::string type = r["rope_type"];
  cfg.type = type == "linear"   ? RopeType::kLinear
             : type == "llama3" ? RopeType::kLlama3
             : type == "yarn"   ? RopeType::kYarn
                                : RopeType::kDefault;
  cfg.theta = r["rope_theta"];
  cfg.head_dim = c["head_dim"];
  cfg.partial_rotary_factor = r.value("partial_rotary_factor", 1.0);
  cfg.factor = r.value("factor", 1.0);
  cfg.low_freq_factor = r.value("low_freq_factor", 1.0);
  cfg.high_freq_factor = r.value("high_freq_factor", 4.0);
  cfg.original_max_position_embeddings = r.value("original_max_position_embeddings", int64_t{0});
  cfg.beta_fast = r.value("beta_fast", 32.0);
  cfg.beta_slow = r.value("beta_slow", 1.0);
  cfg.attention_factor = r.value("attention_factor", 0.0);
  cfg.mscale = r.value("mscale", 0.0);
  cfg.mscale_all_dim = r.value("mscale_all_dim", 0.0);
  cfg.truncate = r.value("truncate", true);
  return cfg;
}

TEST(RopeTable, MatchesTransformers) {
  std::ifstream in("tests/backend/data/rope_hf.json");
  ASSERT_TRUE(in) << "missing fixture tests/backend/data/rope_hf.json";
  const auto cases = nlohmann::json::parse(in);
  ASSERT_GE(cases.size(), 7u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const RopeTable t = RopeTable::build(config_of(c), 4096);
    const auto inv = c["inv_freq"].get<std::vector<uint32_t>>();
    ASSERT_EQ(t.inv_freq().size(), inv.size());
    for (size_t i = 0; i < inv.size(); ++i) {
      // torch's powf may differ from a correctly rounded pow by an ulp.
      EXPECT_NEAR(t.inv_freq()[i], from_bits(inv[i]), std::abs(from_bits(inv[i])) * 2.4e-7f)
          << "inv_freq " << i;
    }
    EXPECT_FLOAT_EQ(t.attention_scaling(), from_bits(c["attention_scaling"].get<uint32_t>()));
    const auto positions = c["positions"].get<std::vector<int64_t>>();
    const auto cos = c["cos"].get<std::vector<uint32_t>>();
    const auto sin = c["sin"].get<std::vector<uint32_t>>();
    const size_t half = inv.size();
    for (size_t p = 0; p < positions.size(); ++p) {
      for (size_t i = 0; i < half; ++i) {
        // Error budget: an ulp in inv_freq, times the position, moves the angle.
        const float tol =
            1e-6f + static_cast<float>(positions[p]) * std::abs(from_bits(inv[i])) * 2.4e-7f;
        EXPECT_NEAR(t.cos(positions[p])[i], from_bits(cos[p * half + i]), tol)
            << "pos " << positions[p] << " i " << i;
        EXPECT_NEAR(t.sin(positions[p])[i], from_bits(sin[p * half + i]), tol)
            << "pos " << positions[p] << " i " << i;
      }
    }
  }
}

TEST(RopeTable, RejectsInconsistentConfigs) {
  EXPECT_THROW(RopeTable::build({.head_dim = 0}, 8), Error);
  EXPECT_THROW(RopeTable::build({.head_dim = 64}, 0), Error);
  EXPECT_THROW(RopeTable::build({.type = RopeType::kLlama3, .head_dim = 64, .factor = 8.0}, 8),
               Error);
  EXPECT_THROW(RopeTable::build({.type = RopeType::kYarn, .head_dim = 64, .factor = 4.0}, 8),
               Error);
  EXPECT_THROW(RopeTable::build({.type = RopeType::kLinear, .head_dim = 64, .factor = 0.0}, 8),
               Error);
  EXPECT_THROW(RopeTable::build({.head_dim = 64, .partial_rotary_factor = 1.5}, 8), Error);
}

}  // namespace
}  // namespace metrale
