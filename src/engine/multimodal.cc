#include "engine/multimodal.h"

#include <algorithm>
#include <array>
#include <string>

#include "core/error.h"
#include "vision/mrope_positions.h"
#include "vision/video_sampling.h"

namespace metrale {

namespace {

// Qwen3-VL and Qwen3.5 write a video frame by frame, each temporal patch after its timestamp;
// GLM-4V each before its timestamp, as a run of image tokens inside <|begin_of_video|> ...
// <|end_of_video|>.
bool timestamped_videos(const VisionConfig& c) {
  return c.tower == VisionTowerKind::kQwen3Vl || c.tower == VisionTowerKind::kQwen3_5 ||
         c.tower == VisionTowerKind::kGlm4v;
}

// mm_token_type_ids of expanded ids (GLM-4V's video frames are image tokens inside its video
// start / end tokens).
std::vector<int32_t> token_types(const VisionConfig& c, std::span<const int32_t> ids) {
  return vision::mm_token_types(
      ids, static_cast<int32_t>(c.image_token_id), static_cast<int32_t>(c.video_token_id),
      static_cast<int32_t>(c.video_start_token_id), static_cast<int32_t>(c.video_end_token_id));
}

// What the processor's replace_image_token / replace_video_token put for one placeholder.
void append_expansion(const VisionConfig& c, const vision::VisionItem& it, size_t index,
                      const Tokenizer* tokenizer, std::vector<int32_t>& out) {
  const bool video = it.kind == vision::VisionKind::kVideo;
  const auto pad = static_cast<int32_t>(video ? c.video_token_id : c.image_token_id);
  if (!video || !timestamped_videos(c)) {
    out.insert(out.end(), static_cast<size_t>(it.n_tokens()), pad);
    return;
  }
  METRALE_CHECK(tokenizer != nullptr, "video ", index, ": ", c.model_type,
                " spells each frame's timestamp in the prompt, which needs the checkpoint's "
                "tokenizer (tokenizer.json)");
  METRALE_CHECK(!it.frame_indices.empty(), "video ", index,
                ": no frame indices (the prompt's timestamps come from them)");
  const bool glm = c.tower == VisionTowerKind::kGlm4v;
  // Qwen3-VL: the mean time of the patch's first and last frame; GLM-4V: its first frame's
  // (VideoMetadata.timestamps[::2]); both at the source's fps, 24 when unknown.
  const std::vector<double> times = vision::temporal_patch_timestamps(
      glm ? vision::VideoFamily::kGlm4v : vision::VideoFamily::kQwen3Vl, it.frame_indices,
      it.fps > 0 ? it.fps : 24.0, static_cast<int>(c.temporal_patch_size));
  METRALE_CHECK(static_cast<int64_t>(times.size()) == it.grid_thw[0], "video ", index, ": ",
                it.frame_indices.size(), " frames make ", times.size(),
                " temporal patches; its grid has ", it.grid_thw[0]);
  for (double t : times) {
    if (glm) {
      // processing_glm4v.py's replace_frame_token_id: <|begin_of_image|>, the frame's image
      // tokens (not video ones: the <|begin_of_video|> around them makes them a video's),
      // <|end_of_image|>, then int(t) as text.
      out.push_back(static_cast<int32_t>(c.vision_start_token_id));
      out.insert(out.end(), static_cast<size_t>(it.tokens_per_frame()),
                 static_cast<int32_t>(c.image_token_id));
      out.push_back(static_cast<int32_t>(c.vision_end_token_id));
      const std::vector<int32_t> text =
          tokenizer->encode(std::to_string(static_cast<int64_t>(t)), false);
      out.insert(out.end(), text.begin(), text.end());
      continue;
    }
    // processing_qwen3_vl.py: per temporal patch "<t seconds>", vision_start, its pads,
    // vision_end.
    const std::vector<int32_t> text = tokenizer->encode(vision::timestamp_text(t), false);
    out.insert(out.end(), text.begin(), text.end());
    out.push_back(static_cast<int32_t>(c.vision_start_token_id));
    out.insert(out.end(), static_cast<size_t>(it.tokens_per_frame()), pad);
    out.push_back(static_cast<int32_t>(c.vision_end_token_id));
  }
}

// expand_placeholders; `order` gets the index of the item each placeholder took.
std::vector<int32_t> expand(const VisionConfig& c, std::span<const int32_t> ids,
                            std::span<const vision::VisionItem> items, int32_t bos,
                            const Tokenizer* tokenizer, std::vector<size_t>& order) {
  const auto image = static_cast<int32_t>(c.image_token_id);
  const auto video = static_cast<int32_t>(c.video_token_id);
  std::vector<size_t> of_kind[2];
  for (size_t i = 0; i < items.size(); ++i)
    of_kind[items[i].kind == vision::VisionKind::kVideo ? 1 : 0].push_back(i);
  std::vector<int32_t> front;
  const bool any =
      std::any_of(ids.begin(), ids.end(), [&](int32_t t) { return t == image || t == video; });
  if (!any) {
    // No placeholder: each item in front of the prompt (after a leading bos) as a chat
    // template writes it, vision_start, one pad, vision_end; images first, then videos.
    if (!ids.empty() && ids.front() == bos) {
      front.push_back(bos);
      ids = ids.subspan(1);
    }
    // GLM-4V's videos: <|begin_of_video|>, <|video|>, <|end_of_video|>.
    const bool glm_video = c.video_start_token_id >= 0;
    for (size_t k = 0; k < 2; ++k) {
      const bool own = k == 1 && glm_video;
      for (size_t i = 0; i < of_kind[k].size(); ++i) {
        front.insert(front.end(),
                     {static_cast<int32_t>(own ? c.video_start_token_id : c.vision_start_token_id),
                      k == 1 ? video : image,
                      static_cast<int32_t>(own ? c.video_end_token_id : c.vision_end_token_id)});
      }
    }
    front.insert(front.end(), ids.begin(), ids.end());
    ids = front;
  }
  std::vector<int32_t> out;
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
    const size_t item = of_kind[k][used[k]];
    append_expansion(c, items[item], used[k]++, tokenizer, out);
    order.push_back(item);
  }
  for (size_t k = 0; k < 2; ++k) {
    METRALE_CHECK(used[k] == of_kind[k].size(), "prompt: ", of_kind[k].size(),
                  k == 1 ? " video(s)" : " image(s)", " given for ", used[k], " placeholder(s)");
  }
  return out;
}

}  // namespace

std::vector<int32_t> expand_placeholders(const VisionConfig& c, std::span<const int32_t> ids,
                                         std::span<const vision::VisionItem> items, int32_t bos,
                                         const Tokenizer* tokenizer) {
  std::vector<size_t> order;
  return expand(c, ids, items, bos, tokenizer, order);
}

MultimodalPrompt plan_multimodal_prompt(const Model& model, std::span<const int32_t> ids,
                                        std::span<const vision::VisionItem> items) {
  const VisionEncoder* enc = model.vision();
  METRALE_CHECK(enc != nullptr, model.config().source, ": model_type \"", model.config().model_type,
                "\" has no vision tower metrale runs (images and videos need one)");
  METRALE_CHECK(model.multimodal_rope(), model.config().source,
                ": the language model has no multimodal rope");
  const VisionConfig& vc = enc->config();
  MultimodalPrompt p;
  p.ids.assign(ids.begin(), ids.end());
  const std::vector<int32_t> types = token_types(vc, ids);
  std::vector<std::array<int64_t, 3>> images, videos;
  std::vector<float> seconds;
  int64_t patches = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const vision::VisionItem& it = items[i];
    METRALE_CHECK(it.patch_dim == vc.patch_dim() && it.merge_size == vc.spatial_merge_size &&
                      static_cast<int64_t>(it.pixels.size()) == it.n_patches() * it.patch_dim,
                  "media item ", i, ": patches of ", it.patch_dim, " values merged by ",
                  it.merge_size, "; the vision tower takes ", vc.patch_dim(), " merged by ",
                  vc.spatial_merge_size);
    if (it.kind == vision::VisionKind::kVideo) {
      // processing_qwen2_5_vl.py's second_per_grid_ts (only Qwen2.5-VL's rope reads it).
      seconds.push_back(vision::second_per_grid(it.frame_indices, it.total_frames, it.fps,
                                                static_cast<int>(vc.temporal_patch_size)));
    }
    (it.kind == vision::VisionKind::kImage ? images : videos).push_back(it.grid_thw);
    patches += it.n_patches();
  }
  // The items in prompt order must be the placeholder runs' kinds in order; a Qwen3-VL /
  // Qwen3.5 / GLM-4V video takes one run per temporal patch (its frames, timestamps between
  // them).
  const bool per_frame = timestamped_videos(vc);
  size_t next = 0;
  int64_t frames_left = 0;  // runs the last video still takes
  for (size_t r = 0; r < types.size(); ++r) {
    if (types[r] == vision::kTextToken || (r > 0 && types[r] == types[r - 1])) continue;
    const bool video = types[r] == vision::kVideoToken;
    if (frames_left > 0) {
      METRALE_CHECK(video, "prompt: the image placeholders at token ", r, " come between frames ",
                    "of media item ", next - 1, ", a video (", frames_left, " frame(s) to go)");
      --frames_left;
      continue;
    }
    METRALE_CHECK(next < items.size(), "prompt: the ", video ? "video" : "image",
                  " placeholders at token ", r, " have no media item (", items.size(), " given)");
    METRALE_CHECK((items[next].kind == vision::VisionKind::kVideo) == video, "prompt: the ",
                  video ? "video" : "image", " placeholders at token ", r, " meet media item ",
                  next, ", a", video ? "n image" : " video");
    if (video && per_frame) frames_left = items[next].grid_thw[0] - 1;
    ++next;
  }
  METRALE_CHECK(frames_left == 0, "prompt: media item ", next - 1, ", a video of ",
                items.empty() ? 0 : items[next - 1].grid_thw[0], " temporal patches, has ",
                frames_left, " frame(s) without placeholders");
  // mrope_positions checks each run's length against its grid and that every grid is used.
  const vision::MropePositions pos =
      vision::mrope_positions(vision::mrope_index_style(model.config().model_type),
                              {.token_types = types,
                               .image_grids = images,
                               .video_grids = videos,
                               .second_per_grid_ts = seconds,
                               .spatial_merge_size = vc.spatial_merge_size,
                               .tokens_per_second = vc.tokens_per_second});
  p.positions3 = pos.positions3;
  p.rope_delta = pos.rope_delta;
  for (size_t r = 0; r < types.size(); ++r)
    if (types[r] != vision::kTextToken) p.embed_rows.push_back(static_cast<int32_t>(r));
  const int64_t rows = patches / vc.merge_rows();
  METRALE_CHECK(rows == static_cast<int64_t>(p.embed_rows.size()), "prompt: ", p.embed_rows.size(),
                " placeholder tokens for media of ", rows);
  return p;
}

int64_t encode_multimodal_prompt(Model& model, MultimodalPrompt& p,
                                 std::span<const vision::VisionItem> items, VisionEmbedCache* cache,
                                 std::span<const uint64_t> hashes, int64_t from) {
  VisionEncoder* enc = model.vision();
  METRALE_CHECK(enc != nullptr, model.config().source, ": no vision tower");
  METRALE_CHECK(cache == nullptr || hashes.size() == items.size(),
                "encode_multimodal_prompt: ", hashes.size(), " hashes for ", items.size(),
                " items");
  const VisionConfig& vc = enc->config();
  // Each row: the merger's features, then Qwen3-VL's deepstack ones (the model's injected_cols).
  const int64_t H = enc->out_cols();
  METRALE_CHECK(H == model.injected_cols(), "vision encoder: rows of ", H,
                " features; the language model takes ", model.injected_cols());
  if (p.encoded.size() != items.size()) {
    p.encoded.assign(items.size(), false);
    p.embeds.assign(p.embed_rows.size() * static_cast<size_t>(H), 0.0f);
  }
  // Item i's rows of embeds start at `first[i]` (rows are in item order).
  std::vector<size_t> first(items.size() + 1, 0);
  for (size_t i = 0; i < items.size(); ++i) {
    first[i + 1] = first[i] + static_cast<size_t>(items[i].n_tokens());
  }
  METRALE_CHECK(first.back() == p.embed_rows.size(), "encode_multimodal_prompt: the items hold ",
                first.back(), " placeholder rows; the prompt has ", p.embed_rows.size());
  auto rows_of = [&](size_t i) {
    return p.embeds.begin() + static_cast<ptrdiff_t>(first[i] * static_cast<size_t>(H));
  };
  // The items the cache lacks go through the tower in one pass; their rows are in item order.
  std::vector<std::array<int64_t, 3>> grids;
  std::vector<float> pixels;
  std::vector<size_t> missed;
  int64_t patches = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (p.encoded[i] || first[i + 1] == first[i] || p.embed_rows[first[i + 1] - 1] < from) {
      continue;
    }
    if (const std::vector<float>* got = cache ? cache->find(hashes[i]) : nullptr) {
      std::copy(got->begin(), got->end(), rows_of(i));
      p.encoded[i] = true;
      continue;
    }
    missed.push_back(i);
    // A GLM-4V video runs as one [t, h, w] grid: the tower's attention spans and resampled
    // positions are per frame, as Glm4vModel.get_video_features' [1, h, w] grids give them.
    grids.push_back(items[i].grid_thw);
    pixels.insert(pixels.end(), items[i].pixels.begin(), items[i].pixels.end());
    patches += items[i].n_patches();
  }
  if (missed.empty()) return 0;
  std::vector<float> fresh(static_cast<size_t>(patches / vc.merge_rows() * H));
  enc->encode(grids, ConstRows{pixels.data(), patches, vc.patch_dim(), vc.patch_dim()},
              Rows{fresh.data(), patches / vc.merge_rows(), H, H});
  size_t at = 0;  // the next missed item's first value in `fresh`
  for (size_t i : missed) {
    const auto n = static_cast<size_t>(items[i].n_tokens() * H);
    const auto begin = fresh.begin() + static_cast<ptrdiff_t>(at);
    std::copy(begin, begin + static_cast<ptrdiff_t>(n), rows_of(i));
    if (cache != nullptr) {
      cache->put(hashes[i], std::vector<float>(begin, begin + static_cast<ptrdiff_t>(n)));
    }
    p.encoded[i] = true;
    at += n;
  }
  return static_cast<int64_t>(missed.size());
}

MultimodalPrompt make_multimodal_prompt(Model& model, std::span<const int32_t> ids,
                                        std::span<const vision::VisionItem> items) {
  MultimodalPrompt p = plan_multimodal_prompt(model, ids, items);
  encode_multimodal_prompt(model, p, items);
  return p;
}

std::vector<int32_t> place_media(const VisionConfig& vc, std::span<const int32_t> ids,
                                 std::vector<vision::VisionItem>& items, int32_t bos,
                                 const Tokenizer* tokenizer) {
  std::vector<size_t> order;
  std::vector<int32_t> expanded = expand(vc, ids, items, bos, tokenizer, order);
  std::vector<vision::VisionItem> ordered;
  ordered.reserve(order.size());
  for (size_t i : order) ordered.push_back(std::move(items[i]));
  items = std::move(ordered);
  return expanded;
}

uint64_t media_hash(const vision::VisionItem& item) {
  // FNV-1a over the kind, the grid and the patch values' bytes.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* data, size_t n) {
    const auto* b = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  const auto kind = static_cast<uint8_t>(item.kind);
  mix(&kind, 1);
  mix(item.grid_thw.data(), sizeof(item.grid_thw));
  mix(item.pixels.data(), item.pixels.size() * sizeof(float));
  return h;
}

const std::vector<float>* VisionEmbedCache::find(uint64_t hash) {
  const auto it = index_.find(hash);
  if (it == index_.end()) {
    ++misses;
    return nullptr;
  }
  ++hits;
  lru_.splice(lru_.begin(), lru_, it->second);
  return &it->second->embeds;
}

void VisionEmbedCache::put(uint64_t hash, std::vector<float> embeds) {
  const size_t size = embeds.size() * sizeof(float);
  if (size > max_bytes_ || index_.count(hash) != 0) return;
  while (bytes_ + size > max_bytes_ && !lru_.empty()) {
    bytes_ -= lru_.back().embeds.size() * sizeof(float);
    index_.erase(lru_.back().hash);
    lru_.pop_back();
  }
  lru_.push_front({hash, std::move(embeds)});
  index_[hash] = lru_.begin();
  bytes_ += size;
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
