#include "vision/mrope_positions.h"

#include <algorithm>
#include <limits>
#include <string>

#include "core/error.h"

namespace metrale::vision {

MropeIndexStyle mrope_index_style(std::string_view model_type) {
  if (model_type == "qwen2_vl") return MropeIndexStyle::kQwen2Vl;
  if (model_type == "qwen2_5_vl") return MropeIndexStyle::kQwen2_5Vl;
  // Glm4vModel.get_rope_index: images as Qwen2-VL's, videos split per frame.
  for (std::string_view t :
       {"qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "glm4v", "glm4v_moe"}) {
    if (model_type == t) return MropeIndexStyle::kQwen3Vl;
  }
  throw make_error("mrope positions: model_type \"", model_type,
                   "\" has no multimodal rope index (expected qwen2_vl, qwen2_5_vl, qwen3_vl, "
                   "qwen3_vl_moe, qwen3_5, qwen3_5_moe, glm4v or glm4v_moe)");
}

std::vector<int32_t> mm_token_types(std::span<const int32_t> ids, int32_t image_token_id,
                                    int32_t video_token_id, int32_t video_start_id,
                                    int32_t video_end_id) {
  std::vector<int32_t> types(ids.size(), kTextToken);
  int64_t open = 0;  // video starts minus video ends so far (the token itself included)
  for (size_t i = 0; i < ids.size(); ++i) {
    if (video_start_id >= 0 && ids[i] == video_start_id) ++open;
    if (video_start_id >= 0 && ids[i] == video_end_id) --open;
    if (ids[i] == image_token_id) types[i] = open > 0 ? kVideoToken : kImageToken;
    if (ids[i] == video_token_id) types[i] = kVideoToken;
  }
  return types;
}

namespace {

struct Grid {
  std::array<int64_t, 3> thw;
  float interval = 1.0f;  // time step per temporal patch (kQwen2_5Vl videos)
  bool scaled = false;    // time(i) = long(float(i) * interval)
};

std::string grid_text(const std::array<int64_t, 3>& g) {
  return detail::concat("[", g[0], ", ", g[1], ", ", g[2], "]");
}

// The grids media runs consume, in order: videos split per frame for kQwen3Vl.
std::vector<Grid> grids_of(MropeIndexStyle style, const MropeIndexInputs& in, bool video) {
  const std::span<const std::array<int64_t, 3>> src = video ? in.video_grids : in.image_grids;
  const char* what = video ? "video_grid_thw" : "image_grid_thw";
  const int64_t m = in.spatial_merge_size;
  if (video && style == MropeIndexStyle::kQwen2_5Vl && !in.second_per_grid_ts.empty()) {
    METRALE_CHECK(in.second_per_grid_ts.size() == src.size(),
                  "mrope positions: ", in.second_per_grid_ts.size(),
                  " second_per_grid_ts values for ", src.size(), " videos");
  }
  std::vector<Grid> out;
  for (size_t i = 0; i < src.size(); ++i) {
    const std::array<int64_t, 3>& g = src[i];
    METRALE_CHECK(g[0] >= 1 && g[1] >= 1 && g[2] >= 1 && g[1] % m == 0 && g[2] % m == 0 &&
                      g[0] <= (1 << 20) && g[1] <= (1 << 20) && g[2] <= (1 << 20),
                  "mrope positions: ", what, "[", i, "] = ", grid_text(g),
                  ": expected positive sizes (at most 2^20) with h and w multiples of "
                  "spatial_merge_size ",
                  m);
    if (video && style == MropeIndexStyle::kQwen3Vl) {
      for (int64_t t = 0; t < g[0]; ++t) out.push_back({.thw = {1, g[1], g[2]}});
      continue;
    }
    Grid grid{.thw = g};
    if (video && style == MropeIndexStyle::kQwen2_5Vl) {
      const float seconds = in.second_per_grid_ts.empty() ? 1.0f : in.second_per_grid_ts[i];
      METRALE_CHECK(seconds >= 0.0f && seconds <= 1e6f, "mrope positions: second_per_grid_ts[", i,
                    "] = ", seconds, ": expected a value in [0, 1e6]");
      // transformers: tokens_per_second * second_per_grid_ts[i], a float32 tensor product.
      grid.interval = static_cast<float>(in.tokens_per_second) * seconds;
      grid.scaled = true;
    }
    out.push_back(grid);
  }
  return out;
}

}  // namespace

MropePositions mrope_positions(MropeIndexStyle style, const MropeIndexInputs& in) {
  const int64_t m = in.spatial_merge_size;
  METRALE_CHECK(m >= 1 && m <= 64, "mrope positions: spatial_merge_size ", m,
                ": expected a value in [1, 64]");
  METRALE_CHECK(style != MropeIndexStyle::kQwen2_5Vl ||
                    (in.tokens_per_second >= 0 && in.tokens_per_second <= 1'000'000),
                "mrope positions: tokens_per_second ", in.tokens_per_second,
                ": expected a value in [0, 1e6]");
  const std::vector<Grid> grids[2] = {grids_of(style, in, false), grids_of(style, in, true)};
  size_t used[2] = {0, 0};
  const size_t n = in.token_types.size();
  MropePositions out;
  out.positions3.resize(n * 3);
  int64_t pos = 0;    // transformers' current_pos
  int64_t most = -1;  // the largest position given
  auto put = [&](size_t row, int64_t t, int64_t h, int64_t w) {
    METRALE_CHECK(std::max({t, h, w}) <= std::numeric_limits<int32_t>::max(),
                  "mrope positions: token ", row, "'s position exceeds int32");
    out.positions3[row * 3 + 0] = static_cast<int32_t>(t);
    out.positions3[row * 3 + 1] = static_cast<int32_t>(h);
    out.positions3[row * 3 + 2] = static_cast<int32_t>(w);
    most = std::max({most, t, h, w});
  };
  for (size_t start = 0; start < n;) {
    const int32_t type = in.token_types[start];
    METRALE_CHECK(type == kTextToken || type == kImageToken || type == kVideoToken,
                  "mrope positions: token ", start, " has type ", type,
                  "; expected 0 (text), 1 (image) or 2 (video)");
    size_t end = start;
    while (end < n && in.token_types[end] == type) ++end;
    const auto len = static_cast<int64_t>(end - start);
    if (type == kTextToken) {
      for (int64_t j = 0; j < len; ++j)
        put(start + static_cast<size_t>(j), pos + j, pos + j, pos + j);
      pos += len;
      start = end;
      continue;
    }
    const bool video = type == kVideoToken;
    const char* kind = video ? "video" : "image";
    const std::vector<Grid>& list = grids[video ? 1 : 0];
    size_t& next = used[video ? 1 : 0];
    METRALE_CHECK(next < list.size(), "mrope positions: the ", kind, " tokens at ", start,
                  " have no grid left (", list.size(), " ", kind,
                  video && style == MropeIndexStyle::kQwen3Vl ? " frame" : "", " grids given)");
    const Grid& g = list[next];
    const int64_t gt = g.thw[0], gh = g.thw[1] / m, gw = g.thw[2] / m;
    METRALE_CHECK(len == gt * gh * gw, "mrope positions: the ", kind, " run at token ", start,
                  " holds ", len, " tokens; its grid ", grid_text(g.thw), " (", kind, " grid ",
                  next, ") merges to ", gt * gh * gw);
    size_t row = start;
    for (int64_t i = 0; i < gt; ++i) {
      const int64_t t = g.scaled ? static_cast<int64_t>(static_cast<float>(i) * g.interval) : i;
      for (int64_t j = 0; j < gh; ++j)
        for (int64_t k = 0; k < gw; ++k) put(row++, pos + t, pos + j, pos + k);
    }
    pos += std::max(g.thw[1], g.thw[2]) / m;
    ++next;
    start = end;
  }
  METRALE_CHECK(used[0] == grids[0].size(), "mrope positions: ", grids[0].size(),
                " image grids given, the prompt's image tokens use ", used[0]);
  METRALE_CHECK(used[1] == grids[1].size(), "mrope positions: ", grids[1].size(), " video",
                style == MropeIndexStyle::kQwen3Vl ? " frame" : "",
                " grids given, the prompt's video tokens use ", used[1]);
  out.rope_delta = n == 0 ? 0 : most + 1 - static_cast<int64_t>(n);
  return out;
}

}  // namespace metrale::vision
