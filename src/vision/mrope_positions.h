#pragma once
// M-RoPE position ids of a prompt holding images and videos: transformers 5.24's
// get_rope_index for one sequence (no padding), per family.
//
// The prompt is split into runs of one token type (mm_token_type_ids: 0 text, 1 image, 2 video).
// A text run of n tokens takes positions p, p + 1, ..., p + n - 1 on every axis, then p += n. A
// media run takes the next grid of its kind, merged to (t, h / m, w / m) tokens in (t, h, w)
// order: token (i, j, k) sits at (p + time(i), p + j, p + k), then p += max(h, w) / m. time(i):
//   kQwen2Vl  (Qwen2VLModel): i;
//   kQwen2_5Vl (Qwen2_5_VLModel): long(float(i) * interval) for a video, the interval
//             float32(tokens_per_second * second_per_grid_ts[video]) (torch's float32 product,
//             truncated toward zero); i for an image;
//   kQwen3Vl  (Qwen3VLModel, Qwen3_5Model, Glm4vModel and their MoE twins): every video grid is
//             first split into grid_t one-frame grids (the prompt separates frames by timestamp
//             text), so a video run is one frame and time(i) = 0.
// rope_delta = max position + 1 - n_tokens: what decode adds to a plain position
// (Sequence::rope_delta).
//
// Stricter than transformers where it would run on or fail obscurely: every media run must
// hold exactly its grid's tokens, and the prompt's runs must use every grid given.
#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace metrale::vision {

enum class MropeIndexStyle : uint8_t { kQwen2Vl, kQwen2_5Vl, kQwen3Vl };

// The style of a model_type (qwen2_vl, qwen2_5_vl, qwen3_vl, qwen3_vl_moe, qwen3_5,
// qwen3_5_moe, glm4v, glm4v_moe); Error naming the type otherwise.
MropeIndexStyle mrope_index_style(std::string_view model_type);

inline constexpr int32_t kTextToken = 0;
inline constexpr int32_t kImageToken = 1;
inline constexpr int32_t kVideoToken = 2;

// mm_token_type_ids as the processor makes them: 1 where ids[i] == image_token_id, 2 where
// ids[i] == video_token_id, else 0. With video_start_id >= 0 (GLM-4V, whose video frames are
// image tokens): an image token after more video_start_id than video_end_id tokens is a video
// token (Glm4vProcessor.create_mm_token_type_ids).
std::vector<int32_t> mm_token_types(std::span<const int32_t> ids, int32_t image_token_id,
                                    int32_t video_token_id, int32_t video_start_id = -1,
                                    int32_t video_end_id = -1);

struct MropeIndexInputs {
  std::span<const int32_t> token_types;                 // [n_tokens] 0, 1 or 2
  std::span<const std::array<int64_t, 3>> image_grids;  // image_grid_thw, in prompt order
  std::span<const std::array<int64_t, 3>> video_grids;  // video_grid_thw, in prompt order
  // kQwen2_5Vl: seconds per temporal patch of each video (float32 in transformers); empty:
  // 1 for every video, as transformers' default.
  std::span<const float> second_per_grid_ts;
  int64_t spatial_merge_size = 2;  // vision_config.spatial_merge_size
  int64_t tokens_per_second = 1;   // kQwen2_5Vl: vision_config.tokens_per_second
};

struct MropePositions {
  std::vector<int32_t> positions3;  // [n_tokens * 3] each token's (t, h, w): StepItem::positions3
  int64_t rope_delta = 0;           // Sequence::rope_delta
};

// Throws Error (naming the token, run or grid) on a bad type, a grid not divisible by the
// merge size, a run whose length is not its grid's, too few or too many grids, or positions
// beyond int32.
MropePositions mrope_positions(MropeIndexStyle style, const MropeIndexInputs& in);

}  // namespace metrale::vision
