#pragma once
// A prompt holding images and videos, ready for a vision-language model's steps: the tower's
// features for the placeholder rows, every row's M-RoPE (t, h, w) position and the rope delta
// decode carries (transformers' get_rope_index), then a chunked prefill that hands each chunk
// its share of them (StepItem::positions3 / embeds / embed_rows).
#include <cstdint>
#include <span>
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
};

// The processor's placeholder expansion on token ids: each run of image (video) pad tokens in
// `ids` is one placeholder, taking the next image (video) item in order and expanded to its
// token count (a run already that long stays). Without any pad token, each item is put in front
// of the prompt (after a leading `bos`, when given) as vision_start, its pads, vision_end
// (images first, then videos). Throws Error when the placeholders of a kind and its items
// differ in number.
std::vector<int32_t> expand_placeholders(const VisionConfig& config, std::span<const int32_t> ids,
                                         std::span<const vision::VisionItem> items,
                                         int32_t bos = -1);

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
