#include "engine/multimodal.h"

#include <algorithm>
#include <array>

#include "core/error.h"
#include "vision/mrope_positions.h"

namespace metrale {

std::vector<int32_t> expand_placeholders(const VisionConfig& c, std::span<const int32_t> ids,
                                         std::span<const vision::VisionItem> items, int32_t bos) {
  const auto image = static_cast<int32_t>(c.image_token_id);
  const auto video = static_cast<int32_t>(c.video_token_id);
  std::vector<const vision::VisionItem*> of_kind[2];
  for (const vision::VisionItem& it : items)
    of_kind[it.kind == vision::VisionKind::kVideo ? 1 : 0].push_back(&it);
  std::vector<int32_t> out;
  const bool any =
      std::any_of(ids.begin(), ids.end(), [&](int32_t t) { return t == image || t == video; });
  if (!any) {
    if (!ids.empty() && ids.front() == bos) {  // the media go after a leading bos
      out.push_back(bos);
      ids = ids.subspan(1);
    }
    for (const auto& list : of_kind) {
      for (const vision::VisionItem* it : list) {
        out.push_back(static_cast<int32_t>(c.vision_start_token_id));
        out.insert(out.end(), static_cast<size_t>(it->n_tokens()),
                   it->kind == vision::VisionKind::kVideo ? video : image);
        out.push_back(static_cast<int32_t>(c.vision_end_token_id));
      }
    }
    out.insert(out.end(), ids.begin(), ids.end());
    return out;
  }
  size_t used[2] = {0, 0};
  for (size_t i = 0; i < ids.size();) {
    if (ids[i] != image && ids[i] != video) {
      out.push_back(ids[i++]);
      continue;
    }
    const int32_t pad = ids[i];
    const size_t k = pad == video ? 1 : 0;
    const char* kind = k == 1 ? "video" : "image";
    while (i < ids.size() && ids[i] == pad) ++i;
    METRALE_CHECK(used[k] < of_kind[k].size(), "prompt: more ", kind, " placeholders than the ",
                  of_kind[k].size(), " ", kind, "(s) given");
    out.insert(out.end(), static_cast<size_t>(of_kind[k][used[k]++]->n_tokens()), pad);
  }
  for (size_t k = 0; k < 2; ++k) {
    METRALE_CHECK(used[k] == of_kind[k].size(), "prompt: ", of_kind[k].size(),
                  k == 1 ? " video(s)" : " image(s)", " given for ", used[k], " placeholder(s)");
  }
  return out;
}

MultimodalPrompt make_multimodal_prompt(Model& model, std::span<const int32_t> ids,
                                        std::span<const vision::VisionItem> items) {
  VisionEncoder* enc = model.vision();
  METRALE_CHECK(enc != nullptr, model.config().source, ": model_type \"", model.config().model_type,
                "\" has no vision tower metrale runs (images and videos need one)");
  METRALE_CHECK(model.multimodal_rope(), model.config().source,
                ": the language model has no multimodal rope");
  const VisionConfig& vc = enc->config();
  MultimodalPrompt p;
  p.ids.assign(ids.begin(), ids.end());
  const std::vector<int32_t> types = vision::mm_token_types(
      ids, static_cast<int32_t>(vc.image_token_id), static_cast<int32_t>(vc.video_token_id));
  std::vector<std::array<int64_t, 3>> images, videos, all;
  int64_t patches = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const vision::VisionItem& it = items[i];
    METRALE_CHECK(it.patch_dim == vc.patch_dim() && it.merge_size == vc.spatial_merge_size &&
                      static_cast<int64_t>(it.pixels.size()) == it.n_patches() * it.patch_dim,
                  "media item ", i, ": patches of ", it.patch_dim, " values merged by ",
                  it.merge_size, "; the vision tower takes ", vc.patch_dim(), " merged by ",
                  vc.spatial_merge_size);
    // Qwen2.5-VL's video time step needs the processor's second_per_grid_ts (temporal patch /
    // the sampled fps), which VisionItem does not carry yet; Qwen3-VL / Qwen3.5's prompts split
    // a video into frames with timestamps, which expand_placeholders does not write yet.
    METRALE_CHECK(it.kind == vision::VisionKind::kImage || vc.tower == VisionTowerKind::kQwen2Vl,
                  "media item ", i, ": videos for ", model.config().model_type,
                  " are not supported yet (Qwen2.5-VL: second_per_grid_ts; Qwen3-VL / Qwen3.5: "
                  "per-frame timestamps)");
    (it.kind == vision::VisionKind::kImage ? images : videos).push_back(it.grid_thw);
    all.push_back(it.grid_thw);
    patches += it.n_patches();
  }
  // The items in prompt order must be the placeholder runs' kinds in order.
  size_t next = 0;
  for (size_t r = 0; r < types.size(); ++r) {
    if (types[r] == vision::kTextToken || (r > 0 && types[r] == types[r - 1])) continue;
    const bool video = types[r] == vision::kVideoToken;
    METRALE_CHECK(next < items.size(), "prompt: the ", video ? "video" : "image",
                  " placeholders at token ", r, " have no media item (", items.size(), " given)");
    METRALE_CHECK((items[next].kind == vision::VisionKind::kVideo) == video, "prompt: the ",
                  video ? "video" : "image", " placeholders at token ", r, " meet media item ",
                  next, ", a", video ? "n image" : " video");
    ++next;
  }
  // mrope_positions checks each run's length against its grid and that every grid is used.
  const vision::MropePositions pos =
      vision::mrope_positions(vision::mrope_index_style(model.config().model_type),
                              {.token_types = types,
                               .image_grids = images,
                               .video_grids = videos,
                               .spatial_merge_size = vc.spatial_merge_size,
                               .tokens_per_second = vc.tokens_per_second});
  p.positions3 = pos.positions3;
  p.rope_delta = pos.rope_delta;
  for (size_t r = 0; r < types.size(); ++r)
    if (types[r] != vision::kTextToken) p.embed_rows.push_back(static_cast<int32_t>(r));
  // One tower pass over every item; its rows are the placeholders' in order.
  std::vector<float> pixels;
  pixels.reserve(static_cast<size_t>(patches * vc.patch_dim()));
  for (const vision::VisionItem& it : items)
    pixels.insert(pixels.end(), it.pixels.begin(), it.pixels.end());
  // Each row: the merger's features, then Qwen3-VL's deepstack ones (the model's injected_cols).
  const int64_t rows = patches / vc.merge_rows(), H = enc->out_cols();
  METRALE_CHECK(H == model.injected_cols(), "vision encoder: rows of ", H,
                " features; the language model takes ", model.injected_cols());
  METRALE_CHECK(rows == static_cast<int64_t>(p.embed_rows.size()), "prompt: ", p.embed_rows.size(),
                " placeholder tokens for media of ", rows);
  p.embeds.resize(static_cast<size_t>(rows * H));
  if (!items.empty()) {
    enc->encode(all, ConstRows{pixels.data(), patches, vc.patch_dim(), vc.patch_dim()},
                Rows{p.embeds.data(), rows, H, H});
  }
  return p;
}

void prefill_multimodal(Model& model, Sequence& seq, const MultimodalPrompt& p,
                        std::span<float> logits, bool all_logits) {
  const auto n = static_cast<int64_t>(p.ids.size());
  METRALE_CHECK(n > 0 && seq.tokens.empty(),
                "prefill_multimodal: needs a prompt and an empty sequence");
  const int64_t V = model.vocab_size(), H = model.injected_cols(), R = model.max_rows();
  METRALE_CHECK(logits.size() == static_cast<size_t>((all_logits ? n : 1) * V),
                "prefill_multimodal: logits buffer holds ", logits.size(), " floats");
  seq.rope_delta = p.rope_delta;
  size_t e = 0;  // the first embed row not yet handed over
  std::vector<int32_t> rows;
  for (int64_t done = 0; done < n; done += R) {
    const int64_t len = std::min(R, n - done);
    const bool last = done + len == n;
    rows.clear();
    const size_t e0 = e;
    while (e < p.embed_rows.size() && p.embed_rows[e] < done + len)
      rows.push_back(p.embed_rows[e++] - static_cast<int32_t>(done));
    StepItem item{
        .seq = &seq,
        .ids = std::span(p.ids).subspan(static_cast<size_t>(done), static_cast<size_t>(len)),
        .logits = all_logits ? LogitRows::kAll
                  : last     ? LogitRows::kLast
                             : LogitRows::kNone,
        .positions3 = std::span(p.positions3)
                          .subspan(static_cast<size_t>(done * 3), static_cast<size_t>(len * 3))};
    if (!rows.empty()) {
      item.embeds = ConstRows{p.embeds.data() + e0 * static_cast<size_t>(H),
                              static_cast<int64_t>(rows.size()), H, H};
      item.embed_rows = rows;
    }
    std::span<float> out =
        all_logits ? logits.subspan(static_cast<size_t>(done * V), static_cast<size_t>(len * V))
        : last     ? logits
                   : std::span<float>();
    model.step({&item, 1}, out);
  }
}

}  // namespace metrale
