// `metrale forward --model DIR --ids 1,2,3 --out FILE.safetensors [--hidden-states]`: one
// prefill over the ids; writes `logits` (f32 [n, vocab]) and, when asked, every layer's
// hidden states `hidden.N` (f32 [n, hidden]; 0 = embeddings, the last after the final norm,
// as HF's output_hidden_states). The path parity checks use.
#include <cstring>

#include "cli/command.h"
#include "cli/options.h"
#include "core/error.h"
#include "io/safetensors/writer.h"

namespace metrale::cli {
namespace {

struct ForwardFlags {
  ModelFlags model;
  LoraFlags lora;
  std::string ids;
  std::string out;
  bool hidden = false;
};

std::span<const std::byte> as_bytes(const std::vector<float>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(float)};
}

void run_forward(ForwardFlags f) {
  const std::vector<int32_t> ids = parse_id_list(f.ids, "--ids");
  const auto n = static_cast<int64_t>(ids.size());
  if (f.hidden) f.model.max_rows = std::max(f.model.max_rows, n);  // hidden states need one chunk
  std::unique_ptr<Model> model = load_model(f.model);
  const std::string adapter = f.lora.apply(*model);
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
  model->prefill(seq, ids, logits, /*all_logits=*/true, f.hidden ? &sink : nullptr);
  model->release(seq);

  SafetensorsWriter w;
  w.add("logits", DType::kF32, Shape{n, V}, as_bytes(logits));
  for (size_t i = 0; i < hidden.size(); ++i) {
    w.add("hidden." + std::to_string(i), DType::kF32, Shape{n, H}, as_bytes(hidden[i]));
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
  cmd->add_option("--ids", f->ids, "comma-separated token ids")->required();
  cmd->add_option("--out,-o", f->out, "output .safetensors file")->required();
  cmd->add_flag("--hidden-states", f->hidden, "also write every layer's hidden states");
  cmd->callback([f] { run_forward(*f); });
}

}  // namespace
METRALE_REGISTER_COMMAND(setup);
}  // namespace metrale::cli
