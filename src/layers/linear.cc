#include "layers/linear.h"

#include "core/error.h"

namespace metrale {

Linear Linear::fused(WeightTensor w, std::vector<Part> parts) {
  Linear l;
  int64_t at = 0;
  for (Part& p : parts) {
    METRALE_CHECK(p.offset == at && p.n_out > 0, "linear '", w.name, "': part '", p.name, "' at ",
                  p.offset, " of ", p.n_out, " outputs does not follow the previous part (", at,
                  ")");
    at += p.n_out;
  }
  METRALE_CHECK(at == w.n_out, "linear '", w.name, "': parts cover ", at, " of ", w.n_out,
                " outputs");
  l.n_in_ = w.n_in;
  l.n_out_ = w.n_out;
  l.tensors_.push_back(std::move(w));
  l.parts_ = std::move(parts);
  return l;
}

Linear Linear::separate(std::vector<WeightTensor> tensors, std::vector<Part> parts) {
  METRALE_CHECK(!tensors.empty() && tensors.size() == parts.size(), "linear: ", tensors.size(),
                " tensors for ", parts.size(), " parts");
  Linear l;
  l.n_in_ = tensors[0].n_in;
  for (size_t i = 0; i < tensors.size(); ++i) {
    METRALE_CHECK(tensors[i].n_in == l.n_in_ && tensors[i].n_out == parts[i].n_out &&
                      parts[i].offset == l.n_out_,
                  "linear: part '", parts[i].name, "' is [", tensors[i].n_out, ", ",
                  tensors[i].n_in, "], expected [", parts[i].n_out, ", ", l.n_in_, "] at column ",
                  l.n_out_);
    l.n_out_ += parts[i].n_out;
  }
  l.tensors_ = std::move(tensors);
  l.parts_ = std::move(parts);
  return l;
}

uint64_t weight_bytes(const WeightTensor& w) {
  return weight_row_bytes(w.format, w.n_in) * static_cast<uint64_t>(w.n_out);
}

uint64_t Linear::bytes() const {
  uint64_t b = 0;
  for (const WeightTensor& w : tensors_) b += weight_bytes(w);
  return b;
}

void Linear::record(Graph& g, Tensor x, Tensor y) const {
  METRALE_CHECK(y.n_cols == n_out_ && x.n_cols == n_in_, "linear '", parts_[0].name, "': [",
                x.n_cols, "] -> [", y.n_cols, "], expected [", n_in_, "] -> [", n_out_, "]");
  if (tensors_.size() == 1) {
    g.add(node::Linear{.x = x, .w = &tensors_[0], .y = y});
  } else {
    for (size_t i = 0; i < tensors_.size(); ++i) {
      g.add(
          node::Linear{.x = x, .w = &tensors_[i], .y = y.cols(parts_[i].offset, parts_[i].n_out)});
    }
  }
  for (size_t i = 0; i < lora_.size(); ++i) {
    if (lora_[i] == nullptr) continue;
    g.add(node::Lora{.x = x, .y = y.cols(parts_[i].offset, parts_[i].n_out), .weights = lora_[i]},
          When::kLoraRows);
  }
}

void Linear::attach_lora(size_t part, const LoraWeights* lora) {
  METRALE_CHECK(part < parts_.size(), "linear: part ", part, " of ", parts_.size());
  METRALE_CHECK(lora == nullptr || (lora->n_in == n_in_ && lora->n_out == parts_[part].n_out),
                "linear '", parts_[part].name, "': LoRA weights [", lora->n_out, ", ", lora->n_in,
                "] do not fit the part's [", parts_[part].n_out, ", ", n_in_, "]");
  if (lora_.empty()) lora_.assign(parts_.size(), nullptr);
  lora_[part] = lora;
}

Linear load_linear(TensorLoader& loader, const std::vector<std::string>& prefixes,
                   const std::vector<int64_t>& n_outs, int64_t n_in, bool has_bias) {
  METRALE_CHECK(!prefixes.empty() && prefixes.size() == n_outs.size(),
                "load_linear: one n_out per prefix");
  std::vector<Linear::Part> parts;
  int64_t at = 0;
  for (size_t i = 0; i < prefixes.size(); ++i) {
    parts.push_back({prefixes[i], at, n_outs[i]});
    at += n_outs[i];
  }
  if (prefixes.size() > 1 && loader.can_fuse(prefixes)) {
    return Linear::fused(loader.fused_linear(prefixes, n_outs, n_in, has_bias), std::move(parts));
  }
  std::vector<WeightTensor> tensors;
  for (size_t i = 0; i < prefixes.size(); ++i)
    tensors.push_back(loader.linear(prefixes[i], n_outs[i], n_in, has_bias));
  return Linear::separate(std::move(tensors), std::move(parts));
}

}  // namespace metrale
