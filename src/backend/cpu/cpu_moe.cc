// CpuBackend's mixture-of-experts ops.
//
// route: per row, softmax in f32 (max-subtracted, as torch), top-k by a stable partial
// selection (larger first; equal values keep the lower expert), optional renormalisation.
//
// moe: the n * k (row, choice) pairs are grouped by expert with a counting sort (rows keep
// their order inside an expert), the input rows gathered once, and then one parallel dispatch
// runs every active expert's gate|up projection over its rows, one the activation, one every
// down projection, and one the weighted sums (quantized experts that read their input in packed
// order get it gathered in the gather and activation passes). Each expert's weights are therefore
// read once per call, and experts no row chose are never read. A row's result is independent of the
// other rows: the linear kernels fix each output's summation order, and a row's k expert
// outputs are added from zero in ascending expert order (HF's index_add_ order).
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/linear_pairs.h"
#include "core/thread_pool.h"

namespace metrale {
namespace {

constexpr int64_t kPiecesPerThread = 8;

template <typename T>
void grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

// DeepseekV3TopkRouter / Glm4MoeTopkRouter, one row at a time. c[e] = sigmoid + bias sits in
// `choice`, the group scores in `group`; a kept group is marked by a non-negative score.
void route_sigmoid(const RouteArgs& a, std::vector<float>& scratch) {
  const int64_t n_experts = a.logits.n_cols, k = a.top_k, n_group = a.n_group;
  const int64_t per = n_experts / n_group;
  grow(scratch, static_cast<size_t>(n_experts + n_group));
  float* choice = scratch.data();
  float* group = choice + n_experts;
  for (int64_t r = 0; r < a.logits.n_rows; ++r) {
    const float* x = a.logits.row(r);
    for (int64_t e = 0; e < n_experts; ++e)
      choice[e] = 1.0f / (1.0f + std::exp(-x[e])) + a.correction_bias[static_cast<size_t>(e)];
    for (int64_t g = 0; g < n_group; ++g) {
      float top1 = -INFINITY, top2 = -INFINITY;
      for (int64_t e = g * per; e < (g + 1) * per; ++e) {
        if (choice[e] > top1) {
          top2 = top1;
          top1 = choice[e];
        } else if (choice[e] > top2) {
          top2 = choice[e];
        }
      }
      group[g] = top1 + top2;
    }
    // Keep the topk_group best groups: mark them by moving them to +inf, the rest to -inf.
    for (int64_t j = 0; j < a.topk_group; ++j) {
      int64_t best = -1;
      for (int64_t g = 0; g < n_group; ++g) {
        if (group[g] != INFINITY && (best < 0 || group[g] > group[best])) best = g;
      }
      group[best] = INFINITY;
    }
    int32_t* ids = a.experts.data() + r * k;
    float* w = a.weights.data() + r * k;
    for (int64_t j = 0; j < k; ++j) {
      int32_t best = -1;
      for (int64_t e = 0; e < n_experts; ++e) {
        if (group[e / per] != INFINITY) continue;
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken = taken || ids[i] == e;
        if (!taken && (best < 0 || choice[e] > choice[best])) best = static_cast<int32_t>(e);
      }
      ids[j] = best;
      w[j] = 1.0f / (1.0f + std::exp(-x[best]));  // the score without the bias
    }
    if (a.normalize) {
      float total = 0.0f;
      for (int64_t j = 0; j < k; ++j) total += w[j];
      total += 1e-20f;
      for (int64_t j = 0; j < k; ++j) w[j] /= total;
    }
    for (int64_t j = 0; j < k; ++j) w[j] *= a.scale;
  }
}

}  // namespace

void CpuBackend::do_route(const RouteArgs& a) {
  if (a.scoring == RouteScoring::kSigmoid) {
    route_sigmoid(a, route_scratch_);
    return;
  }
  const int64_t n_experts = a.logits.n_cols, k = a.top_k;
  for (int64_t r = 0; r < a.logits.n_rows; ++r) {
    const float* x = a.logits.row(r);
    float mx = x[0];
    for (int64_t e = 1; e < n_experts; ++e) mx = std::max(mx, x[e]);
    // Pass 1: the sum of exp; pass 2 re-derives each selected probability, so no [E] buffer.
    float sum = 0.0f;
    for (int64_t e = 0; e < n_experts; ++e) sum += std::exp(x[e] - mx);
    int32_t* ids = a.experts.data() + r * k;
    float* w = a.weights.data() + r * k;
    for (int64_t j = 0; j < k; ++j) {
      // The largest logit not chosen yet (softmax is monotonic); ties to the lower expert.
      int32_t best = -1;
      for (int64_t e = 0; e < n_experts; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken = taken || ids[i] == e;
        if (!taken && (best < 0 || x[e] > x[best])) best = static_cast<int32_t>(e);
      }
      ids[j] = best;
      w[j] = std::exp(x[best] - mx) / sum;
    }
    if (a.normalize) {
      float total = 0.0f;
      for (int64_t j = 0; j < k; ++j) total += w[j];
      for (int64_t j = 0; j < k; ++j) w[j] /= total;
    }
  }
}

void CpuBackend::do_moe(const MoeArgs& a) {
  MoeScratch& s = moe_;
  const int64_t n = a.x.n_rows, k = a.top_k, nk = n * k;
  const auto n_experts = static_cast<int64_t>(a.expert_weights.size());
  const int64_t hidden = a.x.n_cols;
  const int64_t inter = a.expert_weights[0].down.n_in;
  const auto ue = static_cast<size_t>(n_experts), unk = static_cast<size_t>(nk);

  // Group the (row, choice) pairs by expert: slot[r * k + j] is the pair's grouped row.
  grow(s.count, ue);
  grow(s.start, ue);
  grow(s.fill, ue);
  grow(s.slot, unk);
  grow(s.order, unk);
  std::fill(s.count.begin(), s.count.begin() + n_experts, 0);
  for (int64_t i = 0; i < nk; ++i)
    ++s.count[static_cast<size_t>(a.experts[static_cast<size_t>(i)])];
  int32_t at = 0;
  for (size_t e = 0; e < ue; ++e) {
    s.start[e] = at;
    s.fill[e] = at;
    at += s.count[e];
  }
  for (int64_t i = 0; i < nk; ++i)
    s.slot[static_cast<size_t>(i)] =
        s.fill[static_cast<size_t>(a.experts[static_cast<size_t>(i)])]++;
  grow(s.expert_of, unk);
  for (size_t e = 0; e < ue; ++e)
    std::fill_n(s.expert_of.begin() + s.start[e], s.count[e], static_cast<int32_t>(e));
  // Per row, its choices by ascending expert (the order the weighted sum adds them in).
  for (int64_t r = 0; r < n; ++r) {
    int32_t* o = s.order.data() + r * k;
    for (int64_t j = 0; j < k; ++j) o[j] = static_cast<int32_t>(j);
    const int32_t* ids = a.experts.data() + r * k;
    // Insertion sort: k is small, and std::stable_sort would allocate a buffer per call.
    for (int64_t j = 1; j < k; ++j) {
      const int32_t c = o[j];
      int64_t i = j;
      for (; i > 0 && ids[o[i - 1]] > ids[c]; --i) o[i] = o[i - 1];
      o[i] = c;
    }
  }

  // Gather the input rows (f32, and rounded to bf16 for the pairs kernel).
  const bool x_bf16 = cpu::reads_bf16_input(a.expert_weights[0].gate_up);
  const bool h_bf16 = cpu::reads_bf16_input(a.expert_weights[0].down);
  grow(s.x, unk * static_cast<size_t>(hidden));
  grow(s.h, unk * static_cast<size_t>(2 * inter));
  grow(s.y, unk * static_cast<size_t>(hidden));
  if (x_bf16) grow(s.x_bf16, unk * static_cast<size_t>(hidden));
  if (h_bf16) grow(s.h_bf16, unk * static_cast<size_t>(inter));
  const Rows gx = rows_of(s.x.data(), nk, hidden);
  const Rows gh = rows_of(s.h.data(), nk, 2 * inter);
  const Rows gy = rows_of(s.y.data(), nk, hidden);
  // Quantized experts whose kernel reads its own input (cpu/linear_quant.h: packed order for
  // g_idx or padded groups, int8 for q8 layouts): each grouped row is prepared for its expert
  // once, an expert's rows back to back from its first row's place, grouped rows `bytes` apart.
  auto quant_weight = [&](bool gate_up, size_t e) -> const WeightTensor& {
    return gate_up ? a.expert_weights[e].gate_up : a.expert_weights[e].down;
  };
  auto quant_bytes = [&](bool gate_up) {
    int64_t bytes = 0;
    for (size_t e = 0; e < ue; ++e)
      if (s.count[e] > 0) bytes = std::max(bytes, cpu::quant_input_bytes(quant_weight(gate_up, e)));
    return bytes;
  };
  const int64_t xq_bytes = quant_bytes(true), hq_bytes = quant_bytes(false);
  grow(s.x_quant, unk * static_cast<size_t>(xq_bytes) / sizeof(float));
  grow(s.h_quant, unk * static_cast<size_t>(hq_bytes) / sizeof(float));
  auto quant_input = [&](bool gate_up, size_t e) -> uint8_t* {
    if (cpu::quant_input_bytes(quant_weight(gate_up, e)) == 0) return nullptr;
    return gate_up ? reinterpret_cast<uint8_t*>(s.x_quant.data()) + s.start[e] * xq_bytes
                   : reinterpret_cast<uint8_t*>(s.h_quant.data()) + s.start[e] * hq_bytes;
  };
  auto gather_quant = [&](bool gate_up, ConstRows src, int64_t g) {
    const auto e = static_cast<size_t>(s.expert_of[static_cast<size_t>(g)]);
    uint8_t* out = quant_input(gate_up, e);
    if (out == nullptr) return;
    const ConstRows rows{src.row(s.start[e]), s.count[e], src.n_cols, src.stride};
    const int64_t r = g - s.start[e];
    cpu::prepare_quant_input(cpu::quant_layout(quant_weight(gate_up, e)), rows, r, r + 1, out);
  };
  auto gather = [&](int64_t i_begin, int64_t i_end) {
    for (int64_t i = i_begin; i < i_end; ++i) {
      const int64_t g = s.slot[static_cast<size_t>(i)];
      std::copy_n(a.x.row(i / k), hidden, gx.row(g));
      if (x_bf16) cpu::round_rows_bf16(gx, g, g + 1, s.x_bf16.data());
      if (xq_bytes != 0) gather_quant(/*gate_up=*/true, gx, g);
    }
  };
  // Small passes run on this thread: a dispatch would cost more than it saves.
  constexpr int64_t kInlineValues = int64_t{1} << 15;
  auto rows_pass = [&](int64_t n_items, int64_t values_per_item, auto&& fn) {
    if (n_items * values_per_item < kInlineValues || pool_->size() == 1) {
      fn(0, n_items);
    } else {
      pool_->parallel_for(static_cast<size_t>(n_items), [&](size_t b, size_t e, int) {
        fn(static_cast<int64_t>(b), static_cast<int64_t>(e));
      });
    }
  };
  rows_pass(nk, hidden, gather);

  // Capacity for any routing, so that a step choosing more experts than the ones before it
  // does not allocate: one job per expert, at most one item per unit of its outputs.
  const int64_t max_units = (std::max(2 * inter, hidden) + cpu::kLinearUnit - 1) / cpu::kLinearUnit;
  s.jobs.reserve(ue);
  s.items.reserve(ue * static_cast<size_t>(max_units));

  // One dispatch over the output pieces of every active expert's projection.
  auto run_experts = [&](bool gate_up) {
    s.jobs.clear();
    s.items.clear();
    int64_t total_units = 0;
    for (size_t e = 0; e < ue; ++e) {
      if (s.count[e] == 0) continue;
      const MoeExpertWeights& w = a.expert_weights[e];
      const int64_t r0 = s.start[e], rn = s.count[e];
      if (gate_up) {
        s.jobs.push_back(cpu::make_linear_job(ConstRows{gx.row(r0), rn, hidden, hidden},
                                              x_bf16 ? s.x_bf16.data() + r0 * hidden : nullptr,
                                              w.gate_up, Rows{gh.row(r0), rn, 2 * inter, 2 * inter},
                                              quant_input(true, e)));
      } else {
        s.jobs.push_back(cpu::make_linear_job(ConstRows{gh.row(r0), rn, inter, 2 * inter},
                                              h_bf16 ? s.h_bf16.data() + r0 * inter : nullptr,
                                              w.down, Rows{gy.row(r0), rn, hidden, hidden},
                                              quant_input(false, e)));
      }
      total_units += (s.jobs.back().n_out + cpu::kLinearUnit - 1) / cpu::kLinearUnit;
    }
    const int64_t grain0 = std::max<int64_t>(1, total_units / (pool_->size() * kPiecesPerThread));
    for (size_t j = 0; j < s.jobs.size(); ++j) {
      const cpu::LinearJob& job = s.jobs[j];
      const int64_t m = job.unit_multiple();
      const int64_t grain = (grain0 + m - 1) / m * m * cpu::kLinearUnit;
      for (int64_t o = 0; o < job.n_out; o += grain) {
        s.items.push_back({static_cast<int32_t>(j), o, std::min(job.n_out, o + grain)});
      }
    }
    pool_->parallel_for_dynamic(s.items.size(), 1, [&](size_t b, size_t e, int) {
      for (size_t i = b; i < e; ++i) {
        const MoeScratch::Item& it = s.items[i];
        s.jobs[static_cast<size_t>(it.job)].run(it.o_begin, it.o_end);
      }
    });
  };
  run_experts(/*gate_up=*/true);
  // LoRA on the experts: each grouped row's slot, then per active expert its rows' adapters.
  const bool lora = !a.lora_slots.empty() && (a.gate_up_lora != nullptr || a.down_lora != nullptr);
  if (lora) {
    grow(s.lora_slot, unk);
    for (int64_t i = 0; i < nk; ++i)
      s.lora_slot[static_cast<size_t>(s.slot[static_cast<size_t>(i)])] =
          a.lora_slots[static_cast<size_t>(i / k)];
  }
  auto expert_lora = [&](const LoraWeights* w, ConstRows x, Rows y) {
    if (!lora || w == nullptr) return;
    for (size_t e = 0; e < ue; ++e) {
      if (s.count[e] == 0) continue;
      const int64_t r0 = s.start[e], rn = s.count[e];
      do_lora({.x = ConstRows{x.row(r0), rn, x.n_cols, x.stride},
               .y = Rows{y.row(r0), rn, y.n_cols, y.stride},
               .slots = std::span<const int32_t>(s.lora_slot.data() + r0, static_cast<size_t>(rn)),
               .weights = w,
               .expert = static_cast<int64_t>(e)});
    }
  };
  expert_lora(a.gate_up_lora, gx, gh);

  // act(gate) * up into the gate half, then (pairs kernel) rounded to bf16.
  const GatedActivationArgs act{.gate = column_slice(gh, 0, inter),
                                .up = column_slice(gh, inter, inter),
                                .out = column_slice(gh, 0, inter),
                                .act = a.act};
  rows_pass(nk, 2 * inter, [&](int64_t b, int64_t e) {
    cpu::gated_activation_rows(act, b, e);
    const ConstRows h = column_slice(ConstRows(gh), 0, inter);
    if (h_bf16) cpu::round_rows_bf16(h, b, e, s.h_bf16.data());
    if (hq_bytes != 0) {
      for (int64_t g = b; g < e; ++g) gather_quant(/*gate_up=*/false, h, g);
    }
  });
  run_experts(/*gate_up=*/false);
  expert_lora(a.down_lora, column_slice(ConstRows(gh), 0, inter), gy);

  // out[r] = sum of weight * expert output, from zero, in ascending expert order.
  rows_pass(n, hidden * k, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      float* out = a.out.row(r);
      std::fill(out, out + hidden, 0.0f);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t i = r * k + s.order[static_cast<size_t>(r * k + j)];
        const float w = a.weights[static_cast<size_t>(i)];
        const float* y = gy.row(s.slot[static_cast<size_t>(i)]);
        for (int64_t d = 0; d < hidden; ++d) out[d] += y[d] * w;
      }
    }
  });
}

}  // namespace metrale
