#pragma once
// A prompt holding images and videos, ready for a vision-language model's steps: the tower's
// features for the placeholder rows, every row's M-RoPE (t, h, w) position and the rope delta
// decode carries (transformers' get_rope_index; Qwen2.5-VL's video time axis scaled by each
// video's second_per_grid_ts, Qwen3-VL / Qwen3.5's videos one frame per run), then a chunked
// prefill that hands each chunk
// its share of them (StepItem::positions3 / embeds / embed_rows).
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/model.h"
#include "vision/vision_item.h"

namespace metrale {

struct MultimodalPrompt {
  std::vector<int32_t> ids;         // the prompt, each item expanded to its placeholder tokens
  std::vector<int32_t> positions3;  // [ids * 3] each row's (t, h, w) rope position
  int64_t rope_delta = 0;           // Sequence::rope_delta for the rows after the prompt
  std::vector<int32_t> embed_rows;  // ascending: the placeholder rows, in item order
  std::vector<float> embeds;        // [embed_rows, hidden] the tower's output for them
  std::vector<bool> encoded;        // per item: its rows of `embeds` hold the tower's output
};

// The processor's placeholder expansion on token ids: each run of image (video) pad tokens in
// `ids` is one placeholder, taking the next image (video) item in order and expanded as the
// processor's replace_image_token / replace_video_token write it: one pad per merged patch
// (a run already that long stays); for Qwen3-VL / Qwen3.5 videos, per temporal patch the text
// "<t seconds>" (encoded alone by `tokenizer`, which such a video needs), vision_start, its
// pads, vision_end (the template's own vision_start / vision_end stay around them, as in
// transformers); for GLM-4V videos, per temporal patch <|begin_of_image|>, its image tokens,
// <|end_of_image|>, then its first frame's integer second as text (processing_glm4v.py; the
// template's <|begin_of_video|> / <|end_of_video|> stay around them). Without any pad token,
// each item is put in front of the prompt (after a leading `bos`, when given) as a chat
// template writes it, vision_start, pad, vision_end (GLM-4V's videos: video_start, pad,
// video_end; images first, then videos), then expanded. Throws Error when the placeholders of a
// kind and its items differ in number.
std::vector<int32_t> expand_placeholders(const VisionConfig& config, std::span<const int32_t> ids,
                                         std::span<const vision::VisionItem> items,
                                         int32_t bos = -1, const Tokenizer* tokenizer = nullptr);

// expand_placeholders, then `items` (each kind in its own order, kinds in any order) reordered
// to the order their placeholders appear in the returned ids: what make_multimodal_prompt takes.
// `generate --image` and `serve`'s chat content parts both place their media through this.
std::vector<int32_t> place_media(const VisionConfig& config, std::span<const int32_t> ids,
                                 std::vector<vision::VisionItem>& items, int32_t bos = -1,
                                 const Tokenizer* tokenizer = nullptr);

// A 64-bit content hash of what the tower sees (kind, grid, patch values): the key of the
// tower-output cache and of media rows in the server's prefix cache.
uint64_t media_hash(const vision::VisionItem& item);

// The tower's output for one item, [item.n_tokens(), out_width], by content hash: a bounded
// LRU (in bytes), so a multi-turn chat about one image encodes it once. Not thread-safe.
class VisionEmbedCache {
 public:
  explicit VisionEmbedCache(size_t max_bytes) : max_bytes_(max_bytes) {}
  const std::vector<float>* find(uint64_t hash);  // nullptr: not cached; else touched
  void put(uint64_t hash, std::vector<float> embeds);
  size_t bytes() const { return bytes_; }
  int64_t hits = 0, misses = 0;  // find() results

 private:
  struct Entry {
    uint64_t hash;
    std::vector<float> embeds;
  };
  size_t max_bytes_, bytes_ = 0;
  std::list<Entry> lru_;  // most recent first
  std::unordered_map<uint64_t, std::list<Entry>::iterator> index_;
};

// make_multimodal_prompt without the tower: every check, the ids, positions, rope delta and
// embed rows; embeds left empty (encode_multimodal_prompt fills them).
MultimodalPrompt plan_multimodal_prompt(const Model& model, std::span<const int32_t> ids,
                                        std::span<const vision::VisionItem> items);
// Fills p.embeds for the items not yet encoded whose placeholder rows reach row `from` or past
// it (rows before `from` are already in the sequence's KV cache, a cached prefix: an item wholly
// inside it needs no tower pass; its rows stay zero until a later call with a smaller `from`,
// a preempted stream's recompute, needs them), running the tower once over those `cache` does
// not hold; returns how many items went through the tower. `hashes`: media_hash of each item
// (needed with a cache).
int64_t encode_multimodal_prompt(Model& model, MultimodalPrompt& p,
                                 std::span<const vision::VisionItem> items,
                                 VisionEmbedCache* cache = nullptr,
                                 std::span<const uint64_t> hashes = {}, int64_t from = 0);

// `ids` already hold every item's placeholders (image_token_id / video_token_id, one per merged
// patch, as the processor expands them); `items` are the preprocessed media in prompt order.
// Runs the model's vision tower over all items in one pass. Throws Error when the model has no
// vision tower (a text-only model, or a tower not built yet), when the placeholders and the
// items disagree (count, kind or size), or when the items exceed the tower's max_patches.
MultimodalPrompt make_multimodal_prompt(Model& model, std::span<const int32_t> ids,
                                        std::span<const vision::VisionItem> items);

// Appends the prompt to the empty `seq` (setting its rope_delta) in chunks of at most
// max_rows(). logits: [ids, V] when all_logits, else [1, V] for the last row.
void prefill_multimodal(Model& model, Sequence& seq, const MultimodalPrompt& prompt,
                        std::span<float> logits, bool all_logits = false);

}  // namespace metrale
