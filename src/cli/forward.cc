// `metrale forward --model DIR --ids 1,2,3 --out FILE.safetensors [--hidden-states]`: one
// prefill over the ids; writes `logits` (f32 [n, vocab]) and, when asked, every layer's
// hidden states `hidden.N` (f32 [n, hidden]; 0 = embeddings, the last after the final norm,
// as HF's output_hidden_states). The path parity checks use. With --image / --video
// (vision-language checkpoints) the media go in place of the prompt's pad tokens (or before
// it) as `generate --image` places them, and `vision` (f32 [media tokens, hidden]: the tower's
// output, the rows that replace the pads) and `prompt_ids` (the expanded prompt) are written too;
// --prompt TEXT may replace --ids.
#include <cstring>

#include "cli/command.h"
#include "cli/media.h"
#include "cli/options.h"
#include "core/error.h"
#include "io/safetensors/writer.h"

namespace metrale::cli {
namespace {

struct ForwardFlags {
  ModelFlags model;
  LoraFlags lora;
  MediaFlags media;
  std::string ids;
  std::string prompt;
  std::string out;
  bool hidden = false;
};

std::span<const std::byte> as_bytes(const std::vector<float>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(float)};
}

void run_forward(ForwardFlags f) {
  METRALE_CHECK(f.ids.empty() != f.prompt.empty(), "forward: give one of --ids and --prompt");
  std::vector<int32_t> ids = f.ids.empty() ? std::vector<int32_t>{} : parse_id_list(f.ids, "--ids");
  // Hidden states need one chunk; media expand the prompt by their tokens (known once loaded:
  // one step of up to 1024 rows, or --max-rows).
  const int64_t rows = f.media.empty() ? static_cast<int64_t>(ids.size()) : int64_t{1024};
  if (f.hidden || !f.media.empty()) f.model.max_rows = std::max(f.model.max_rows, rows);
  std::unique_ptr<Model> model = load_model(f.model);
  const std::string adapter = f.lora.apply(*model);
  if (!f.prompt.empty()) {
    METRALE_CHECK(model->tokenizer() != nullptr, f.model.dir,
                  ": no tokenizer.json, so --prompt cannot be encoded; pass --ids");
    ids = model->tokenizer()->encode(f.prompt, /*add_special_tokens=*/true);
  }
  METRALE_CHECK(!ids.empty(), "forward: the prompt is empty");
  MultimodalPrompt mm;
  if (!f.media.empty()) {
    mm = f.media.prompt(*model, ids);
    ids = mm.ids;
    METRALE_CHECK(static_cast<int64_t>(ids.size()) <= model->max_rows(),
                  "forward: the prompt with ", "its media has ", ids.size(),
                  " tokens; one step holds ", model->max_rows());
  }
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t V = model->vocab_size(), H = model->config().hidden_size;
  std::vector<float> logits(static_cast<size_t>(n * V));
  std::vector<std::vector<float>> hidden;
  HiddenSink sink = [&](int64_t index, ConstRows h) {
    if (static_cast<size_t>(index) >= hidden.size()) hidden.resize(static_cast<size_t>(index) + 1);
    std::vector<float>& dst = hidden[static_cast<size_t>(index)];
    dst.resize(static_cast<size_t>(n * H));
    for (int64_t r = 0; r < n; ++r)
      std::memcpy(dst.data() + r * H, h.row(r), static_cast<size_t>(H) * 4);
  };
  Sequence seq;
  model->set_adapter(seq, adapter);
  if (f.media.empty()) {
    model->prefill(seq, ids, logits, /*all_logits=*/true, f.hidden ? &sink : nullptr);
  } else {
    seq.rope_delta = mm.rope_delta;
    StepItem item{.seq = &seq, .ids = ids, .logits = LogitRows::kAll, .positions3 = mm.positions3};
    if (!mm.embed_rows.empty()) {
      const int64_t E = model->injected_cols();  // hidden_size, and any deepstack features
      item.embeds = ConstRows{mm.embeds.data(), static_cast<int64_t>(mm.embed_rows.size()), E, E};
      item.embed_rows = mm.embed_rows;
    }
    model->step({&item, 1}, logits, f.hidden ? &sink : nullptr);
  }
  model->release(seq);

  SafetensorsWriter w;
  w.add("logits", DType::kF32, Shape{n, V}, as_bytes(logits));
  for (size_t i = 0; i < hidden.size(); ++i) {
    w.add("hidden." + std::to_string(i), DType::kF32, Shape{n, H}, as_bytes(hidden[i]));
  }
  if (!f.media.empty()) {
    w.add("vision", DType::kF32,
          Shape{static_cast<int64_t>(mm.embed_rows.size()), model->injected_cols()},
          as_bytes(mm.embeds));
    std::vector<float> as_float(ids.begin(), ids.end());  // exact: ids < 2^24
    w.add("prompt_ids", DType::kF32, Shape{n}, as_bytes(as_float));
  }
  w.set_metadata("model", model->dir().string());
  if (!adapter.empty()) w.set_metadata("adapter", adapter);
  w.write(f.out);
}

void setup(CLI::App& app) {
  auto f = std::make_shared<ForwardFlags>();
  auto* cmd = app.add_subcommand("forward", "run one prefill and write logits (and hidden states)");
  f->model.add_to(*cmd);
  f->lora.add_to(*cmd);
  f->media.add_to(*cmd);
  cmd->add_option("--ids", f->ids, "comma-separated token ids");
  cmd->add_option("--prompt,-p", f->prompt, "prompt text (encoded with the model's tokenizer)");
  cmd->add_option("--out,-o", f->out, "output .safetensors file")->required();
  cmd->add_flag("--hidden-states", f->hidden, "also write every layer's hidden states");
  cmd->callback([f] { run_forward(*f); });
}

}  // namespace
METRALE_REGISTER_COMMAND(setup);
}  // namespace metrale::cli
