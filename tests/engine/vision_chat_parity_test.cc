// An image inside a multi-turn chat, against transformers (chat.safetensors of the tiny
// Qwen2.5-VL and Qwen3-VL, tools/fixtures/models/vision_chat_fixtures.py): the conversation
// rendered by the checkpoint's chat_template.jinja (Qwen2.5-VL's own; Qwen3.5's with
// enable_thinking false) and encoded as the server does, the image files decoded and
// preprocessed as the server does, and the placeholders expanded by place_media give the
// processor's apply_chat_template ids and pixel values; M-RoPE positions and rope delta equal
// get_rope_index's, the logits of the last user turn's rows equal the forward's within 1e-4 and
// 10 greedy tokens equal generate's. Cases: turn 1 (an image and a question), a text follow-up
// after the assistant's answer, and a follow-up that brings a second image.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "chat_fixture.h"
#include "engine/multimodal.h"
#include "fixture_util.h"
#include "support/test_support.h"
#include "vision/decode.h"
#include "vision/preprocess.h"
#include "vision/processor_config.h"

namespace metrale {
namespace {

using testing::ChatFixture;

constexpr const char* kImages[] = {"tests/data/vision/images/photo_chelsea.jpg",
                                   "tests/data/vision/images/grey16.png"};

int32_t argmax(const float* v, int64_t n) {
  return static_cast<int32_t>(std::max_element(v, v + n) - v);
}

// The case's conversation as the server renders it: the checkpoint's template over the messages
// (image parts as {"type": "image"}, what take_media_parts leaves), with a generation prompt.
std::string render(const std::string& dir, const ChatFixture& f, const std::string& c) {
  const chat::ChatTemplate t = chat::ChatTemplate::load(dir);
  const std::string request = R"({"messages": )" + f.messages(c) +
                              R"(, "add_generation_prompt": true, "chat_template_kwargs": )" +
                              f.template_kwargs() + "}";
  return t.render(chat::ChatRequest::from_json(request, "chat.safetensors"));
}

TEST(VisionChatParity, MultiTurnImageChatsEqualTransformers) {
  for (const char* fixture : {"qwen2_5_vl_f32", "qwen3_vl_f32"}) {
    const std::string dir = testing::fixture_dir(fixture);
    const ChatFixture f(fixture);
    // The image files through metrale's decoder and the checkpoint's processor config: the
    // processor's pixel values and grids, bit for bit.
    std::vector<vision::VisionItem> files;
    for (const char* path : kImages) {
      files.push_back(vision::preprocess_image(vision::decode_image(test::read_file(path)),
                                               vision::load_image_processor_config(dir)));
    }
    const std::vector<vision::VisionItem> want_items = f.images("second_image");
    for (size_t i = 0; i < files.size(); ++i) {
      EXPECT_EQ(files[i].grid_thw, want_items[i].grid_thw) << fixture << " image " << i;
      EXPECT_EQ(files[i].pixels, want_items[i].pixels) << fixture << " image " << i;
    }
    for (int64_t max_rows : {int64_t{160}, int64_t{16}}) {  // one chunk; chunks cutting images
      auto m = Model::load(
          dir, {.n_threads = 2, .kv_tokens = 256, .max_rows = max_rows, .max_image_patches = 256});
      for (const std::string c : ChatFixture::kCases) {
        SCOPED_TRACE(::testing::Message() << fixture << " " << c << " max_rows " << max_rows);
        const std::vector<int32_t> text = m->tokenizer()->encode(render(dir, f, c), false);
        std::vector<vision::VisionItem> items(files.begin(),
                                              files.begin() + (c == "second_image" ? 2 : 1));
        const std::vector<int32_t> ids = place_media(
            m->vision()->config(), text, items,
            static_cast<int32_t>(m->config().bos_token_id.value_or(-1)), m->tokenizer());
        ASSERT_EQ(ids, f.ids(c));
        const MultimodalPrompt p = make_multimodal_prompt(*m, ids, items);
        EXPECT_EQ(p.rope_delta, f.scalar(c + ".rope_delta"));
        const int64_t n = static_cast<int64_t>(ids.size());
        const std::vector<int64_t> positions = f.get<int64_t>(c + ".positions");  // [3, n]
        for (int64_t r = 0; r < n; ++r) {
          for (int64_t a = 0; a < 3; ++a) {
            ASSERT_EQ(p.positions3[static_cast<size_t>(3 * r + a)],
                      positions[static_cast<size_t>(a * n + r)])
                << "row " << r << " axis " << a;
          }
        }
        const int64_t V = m->vocab_size();
        std::vector<float> logits(static_cast<size_t>(n * V));
        Sequence seq;
        prefill_multimodal(*m, seq, p, logits, /*all_logits=*/true);
        const int64_t from = f.scalar(c + ".logits_from");
        const std::vector<float> want = f.get<float>(c + ".logits");
        ASSERT_EQ(want.size(), static_cast<size_t>((n - from) * V));
        EXPECT_LE(testing::max_abs_diff(logits.data() + from * V, want.data(), want.size()), 1e-4f);
        const std::vector<int32_t> greedy = f.greedy(c);
        std::vector<int32_t> got = {argmax(logits.data() + (n - 1) * V, V)};
        std::vector<float> step(static_cast<size_t>(V));
        while (got.size() < greedy.size()) {
          Sequence* s = &seq;
          m->decode({&s, 1}, std::span(got).last(1), step);
          got.push_back(argmax(step.data(), V));
        }
        EXPECT_EQ(got, greedy);
        m->release(seq);
      }
    }
  }
}

}  // namespace
}  // namespace metrale
