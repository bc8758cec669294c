#include "backend/cpu/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <vector>

#include "core/dtype.h"

namespace metrale::cpu::reference {

void linear(ConstRows x, WeightFormat format, const void* w, int64_t n_out, int64_t n_in,
            const float* bias, Rows y) {
  linear(x, format, w, QuantParams{}, n_out, n_in, bias, y);
}

void linear(ConstRows x, WeightFormat format, const void* w, const QuantParams& quant,
            int64_t n_out, int64_t n_in, const float* bias, Rows y) {
  std::vector<float> row(static_cast<size_t>(n_in));
  const size_t row_bytes = weight_row_bytes(format, n_in);
  for (int64_t o = 0; o < n_out; ++o) {
    dequantize_row(format, static_cast<const char*>(w) + static_cast<size_t>(o) * row_bytes, quant,
                   o, n_in, row.data());
    for (int64_t r = 0; r < x.n_rows; ++r) {
      double s = 0.0;
      for (int64_t i = 0; i < n_in; ++i)
        s += static_cast<double>(x.row(r)[i]) * row[static_cast<size_t>(i)];
      if (bias != nullptr) s += bias[o];
      y.row(r)[o] = static_cast<float>(s);
    }
  }
}

void rms_norm(const RmsNormArgs& a) {
  const int64_t n = a.x.n_cols;
  const int64_t group = a.group > 0 ? a.group : n;
  for (int64_t r = 0; r < a.x.n_rows; ++r) {
    const float* src = a.x.row(r);
    if (a.residual.data != nullptr) {
      for (int64_t i = 0; i < n; ++i) a.residual.row(r)[i] += src[i];
      src = a.residual.row(r);
    }
    for (int64_t g0 = 0; g0 < n; g0 += group) {
      double ss = 0.0;
      for (int64_t i = 0; i < group; ++i) ss += static_cast<double>(src[g0 + i]) * src[g0 + i];
      const float inv =
          static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(group) + a.eps));
      for (int64_t i = 0; i < group; ++i) {
        const float w = a.style == NormStyle::kOnePlusWeight ? 1.0f + a.weight[i] : a.weight[i];
        const float y = (src[g0 + i] * inv) * w;
        if (a.gate.data == nullptr) {
          a.out.row(r)[g0 + i] = y;
        } else {
          const double g = a.gate.row(r)[g0 + i];
          a.out.row(r)[g0 + i] = static_cast<float>(y * (g / (1.0 + std::exp(-g))));
        }
      }
    }
  }
}

void rope(const RopeArgs& a) {
  const int64_t half = a.table.rotary_dim / 2;
  for (int64_t r = 0; r < a.x.n_rows; ++r) {
    const int64_t pos = a.positions[static_cast<size_t>(r)];
    for (int64_t h = 0; h < a.n_heads; ++h) {
      float* x = a.x.row(r) + h * a.head_dim + a.offset;
      for (int64_t i = 0; i < half; ++i) {
        const float c = a.table.cos[pos * half + i], s = a.table.sin[pos * half + i];
        // rotate_half pairs i with i + half; interleaved pairs are (2i, 2i + 1).
        const int64_t i1 = a.pairs ? 2 * i : i, i2 = a.pairs ? 2 * i + 1 : i + half;
        const float x1 = x[i1], x2 = x[i2];
        x[i1] = x1 * c + (-x2) * s;  // the first of the pair takes -x2
        x[i2] = x2 * c + x1 * s;
      }
    }
  }
}

double activate(double g, Activation act) {
  switch (act) {
    case Activation::kSilu:
      return g / (1.0 + std::exp(-g));
    case Activation::kGeluTanh:
      return 0.5 * g *
             (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (g + 0.044715 * g * g * g)));
    case Activation::kGelu:
      return 0.5 * g * (1.0 + std::erf(g / std::sqrt(2.0)));
    case Activation::kQuickGelu:
      return g / (1.0 + std::exp(-1.702 * g));
  }
  return g;
}

void gated_activation(const GatedActivationArgs& a) {
  for (int64_t r = 0; r < a.gate.n_rows; ++r) {
    for (int64_t i = 0; i < a.gate.n_cols; ++i) {
      a.out.row(r)[i] = static_cast<float>(activate(a.gate.row(r)[i], a.act) * a.up.row(r)[i]);
    }
  }
}

void activation(const ActivationArgs& a) {
  for (int64_t r = 0; r < a.x.n_rows; ++r) {
    for (int64_t i = 0; i < a.x.n_cols; ++i)
      a.out.row(r)[i] = static_cast<float>(activate(a.x.row(r)[i], a.act));
  }
}

void layer_norm(const LayerNormArgs& a) {
  const int64_t n = a.x.n_cols;
  for (int64_t r = 0; r < a.x.n_rows; ++r) {
    const float* x = a.x.row(r);
    double mean = 0.0, var = 0.0;
    for (int64_t i = 0; i < n; ++i) mean += x[i];
    mean /= static_cast<double>(n);
    for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
    var /= static_cast<double>(n);
    const double rstd = 1.0 / std::sqrt(var + a.eps);
    for (int64_t i = 0; i < n; ++i) {
      a.out.row(r)[i] = static_cast<float>((x[i] - mean) * rstd * a.weight[i] +
                                           (a.bias != nullptr ? a.bias[i] : 0.0));
    }
  }
}

void varlen_attention(const VarlenAttentionArgs& a) {
  const int64_t D = a.head_dim;
  const double scale = a.scale != 0.0f ? a.scale : 1.0 / std::sqrt(static_cast<double>(D));
  for (size_t s = 0; s + 1 < a.cu_seqlens.size(); ++s) {
    const int64_t s0 = a.cu_seqlens[s], s1 = a.cu_seqlens[s + 1];
    std::vector<double> p(static_cast<size_t>(s1 - s0));
    for (int64_t r = s0; r < s1; ++r) {
      for (int64_t h = 0; h < a.n_heads; ++h) {
        const float* q = a.q.row(r) + h * D;
        double mx = -INFINITY;
        for (int64_t t = s0; t < s1; ++t) {
          double d = 0.0;
          for (int64_t i = 0; i < D; ++i) d += static_cast<double>(q[i]) * a.k.row(t)[h * D + i];
          p[static_cast<size_t>(t - s0)] = d * scale;
          mx = std::max(mx, d * scale);
        }
        double sum = 0.0;
        for (double& v : p) sum += (v = std::exp(v - mx));
        for (int64_t i = 0; i < D; ++i) {
          double o = 0.0;
          for (int64_t t = s0; t < s1; ++t)
            o += p[static_cast<size_t>(t - s0)] * a.v.row(t)[h * D + i];
          a.out.row(r)[h * D + i] = static_cast<float>(o / sum);
        }
      }
    }
  }
}

void attention_row(const float* q, const float* k, const float* v, int64_t pos,
                   const AttentionShape& s, float* out) {
  const int64_t group = s.n_heads / s.n_kv_heads;
  const int64_t start = s.sliding_window > 0 ? std::max<int64_t>(0, pos - s.sliding_window + 1) : 0;
  const int64_t kv_row = s.n_kv_heads * s.head_dim;
  std::vector<double> p(static_cast<size_t>(pos + 1));
  for (int64_t h = 0; h < s.n_heads; ++h) {
    const int64_t kvh = h / group;
    const float* qh = q + h * s.head_dim;
    double mx = -INFINITY;
    for (int64_t t = start; t <= pos; ++t) {
      double d = 0.0;
      for (int64_t i = 0; i < s.head_dim; ++i)
        d += static_cast<double>(qh[i]) * k[t * kv_row + kvh * s.head_dim + i];
      p[static_cast<size_t>(t)] = d * s.scale;
      mx = std::max(mx, p[static_cast<size_t>(t)]);
    }
    double sum = 0.0;
    for (int64_t t = start; t <= pos; ++t) {
      p[static_cast<size_t>(t)] = std::exp(p[static_cast<size_t>(t)] - mx);
      sum += p[static_cast<size_t>(t)];
    }
    for (int64_t i = 0; i < s.head_dim; ++i) {
      double o = 0.0;
      for (int64_t t = start; t <= pos; ++t)
        o += p[static_cast<size_t>(t)] * v[t * kv_row + kvh * s.head_dim + i];
      out[h * s.head_dim + i] = static_cast<float>(o / sum);
    }
  }
}

namespace {

size_t state_elem_bytes(DType t) { return t == DType::kF32 ? sizeof(float) : sizeof(uint16_t); }

// Element i of a KV cache array of element type t, widened exactly.
double kv_value(const void* base, int64_t i, DType t) {
  if (t == DType::kF32) return static_cast<const float*>(base)[i];
  const uint16_t bits = static_cast<const uint16_t*>(base)[i];
  return t == DType::kBF16 ? bf16_to_f32(bits) : f16_to_f32(bits);
}

}  // namespace

void latent_attention(const LatentAttentionArgs& a) {
  const KvLayout& kv = a.cache.layout;
  const int64_t dim = kv.head_dim, rank = a.kv_rank, rope = dim - rank, ps = kv.page_size;
  for (int64_t r = 0; r < a.q.n_rows; ++r) {
    const KvPageTable& t = a.seqs[static_cast<size_t>(a.row_seq[static_cast<size_t>(r)])];
    const int64_t n_keys = a.positions[static_cast<size_t>(r)] + 1;
    auto key = [&](int64_t k, int64_t d) {
      const int64_t page = t.block_table[static_cast<size_t>(k / ps)];
      return kv_value(a.cache.k, page * kv.page_elems() + d * ps + k % ps, kv.dtype);
    };
    for (int64_t h = 0; h < a.n_heads; ++h) {
      const float* ql = a.q_latent.row(r) + h * rank;
      const float* qr = a.q.row(r) + h * (a.nope_dim + rope) + a.nope_dim;
      std::vector<double> p(static_cast<size_t>(n_keys));
      double mx = -INFINITY;
      for (int64_t k = 0; k < n_keys; ++k) {
        double s = 0.0;
        for (int64_t d = 0; d < dim; ++d) s += (d < rank ? ql[d] : qr[d - rank]) * key(k, d);
        p[static_cast<size_t>(k)] = s * a.scale;
        mx = std::max(mx, p[static_cast<size_t>(k)]);
      }
      double sum = 0.0;
      for (double& v : p) sum += v = std::exp(v - mx);
      float* out = a.out.row(r) + h * rank;
      for (int64_t d = 0; d < rank; ++d) {
        double acc = 0.0;
        for (int64_t k = 0; k < n_keys; ++k) acc += p[static_cast<size_t>(k)] * key(k, d);
        out[d] = static_cast<float>(acc / sum);
      }
    }
  }
}

void causal_conv(const CausalConvArgs& a) {
  const int64_t C = a.x.n_cols, K = a.kernel, n = a.x.n_rows;
  for (int64_t r0 = 0; r0 < n;) {
    const StateRun& run = a.state.runs[static_cast<size_t>(a.row_seq[static_cast<size_t>(r0)])];
    const auto len = static_cast<int64_t>(run.out.size());
    // The stream: K - 1 state rows, then the sequence's x rows.
    std::vector<float> u(static_cast<size_t>((K - 1 + len) * C));
    to_f32(run.in + a.state.offset, a.state.dtype, u.data(), static_cast<size_t>((K - 1) * C));
    for (int64_t i = 0; i < len; ++i)
      std::copy(a.x.row(r0 + i), a.x.row(r0 + i) + C, u.begin() + (K - 1 + i) * C);
    for (int64_t i = 0; i < len; ++i) {
      for (int64_t c = 0; c < C; ++c) {
        double acc = 0.0;
        for (int64_t j = 0; j < K; ++j)
          acc += static_cast<double>(a.weight[j * C + c]) * u[static_cast<size_t>((i + j) * C + c)];
        if (a.silu) acc = acc / (1.0 + std::exp(-acc));
        a.out.row(r0 + i)[c] = static_cast<float>(acc);
      }
      std::byte* dst = run.out[static_cast<size_t>(i)];
      if (dst != nullptr) {  // later rows read the kept state as stored
        from_f32(u.data() + (i + 1) * C, a.state.dtype, dst + a.state.offset,
                 static_cast<size_t>((K - 1) * C));
        to_f32(dst + a.state.offset, a.state.dtype, u.data() + (i + 1) * C,
               static_cast<size_t>((K - 1) * C));
      }
    }
    r0 += len;
  }
}

void delta_rule(const DeltaRuleArgs& a) {
  const int64_t n = a.q.n_rows, dk = a.k_head_dim, dv = a.v_head_dim;
  const int64_t group = a.n_v_heads / a.n_k_heads;
  const size_t esz = state_elem_bytes(a.state.dtype);
  const auto head_elems = static_cast<size_t>(dk * dv);
  std::vector<float> stored(head_elems);
  std::vector<double> S(head_elems), qn(static_cast<size_t>(dk)), kn(static_cast<size_t>(dk)),
      kv(static_cast<size_t>(dv));
  for (int64_t r0 = 0; r0 < n;) {
    const StateRun& run = a.state.runs[static_cast<size_t>(a.row_seq[static_cast<size_t>(r0)])];
    const auto len = static_cast<int64_t>(run.out.size());
    for (int64_t h = 0; h < a.n_v_heads; ++h) {
      const size_t head_bytes = static_cast<size_t>(h) * head_elems * esz;
      to_f32(run.in + a.state.offset + head_bytes, a.state.dtype, stored.data(), head_elems);
      std::copy(stored.begin(), stored.end(), S.begin());
      for (int64_t i = 0; i < len; ++i) {
        const int64_t r = r0 + i, kh = h / group;
        double qq = 0.0, kk = 0.0;
        for (int64_t d = 0; d < dk; ++d) {
          qq += static_cast<double>(a.q.row(r)[kh * dk + d]) * a.q.row(r)[kh * dk + d];
          kk += static_cast<double>(a.k.row(r)[kh * dk + d]) * a.k.row(r)[kh * dk + d];
        }
        const double q_inv = 1.0 / std::sqrt(qq + 1e-6) / std::sqrt(static_cast<double>(dk));
        const double k_inv = 1.0 / std::sqrt(kk + 1e-6);
        for (int64_t d = 0; d < dk; ++d) {
          qn[static_cast<size_t>(d)] = a.q.row(r)[kh * dk + d] * q_inv;
          kn[static_cast<size_t>(d)] = a.k.row(r)[kh * dk + d] * k_inv;
        }
        const double x = static_cast<double>(a.a.row(r)[h]) + a.dt_bias[h];
        const double softplus = x > 20.0 ? x : std::log1p(std::exp(x));
        const double decay = std::exp(-std::exp(static_cast<double>(a.a_log[h])) * softplus);
        const double beta = 1.0 / (1.0 + std::exp(-static_cast<double>(a.b.row(r)[h])));
        for (double& s : S) s *= decay;
        std::fill(kv.begin(), kv.end(), 0.0);
        for (int64_t d = 0; d < dk; ++d)
          for (int64_t c = 0; c < dv; ++c)
            kv[static_cast<size_t>(c)] +=
                S[static_cast<size_t>(d * dv + c)] * kn[static_cast<size_t>(d)];
        for (int64_t c = 0; c < dv; ++c) {
          const double delta = (a.v.row(r)[h * dv + c] - kv[static_cast<size_t>(c)]) * beta;
          for (int64_t d = 0; d < dk; ++d)
            S[static_cast<size_t>(d * dv + c)] += kn[static_cast<size_t>(d)] * delta;
        }
        for (int64_t c = 0; c < dv; ++c) {
          double o = 0.0;
          for (int64_t d = 0; d < dk; ++d)
            o += S[static_cast<size_t>(d * dv + c)] * qn[static_cast<size_t>(d)];
          a.out.row(r)[h * dv + c] = static_cast<float>(o);
        }
        std::byte* dst = run.out[static_cast<size_t>(i)];
        if (dst != nullptr) {
          for (size_t e = 0; e < head_elems; ++e) stored[e] = static_cast<float>(S[e]);
          from_f32(stored.data(), a.state.dtype, dst + a.state.offset + head_bytes, head_elems);
          to_f32(dst + a.state.offset + head_bytes, a.state.dtype, stored.data(), head_elems);
          std::copy(stored.begin(), stored.end(), S.begin());
        }
      }
    }
    r0 += len;
  }
}

void sigmoid_mul(const SigmoidMulArgs& a) {
  for (int64_t r = 0; r < a.y.n_rows; ++r) {
    for (int64_t i = 0; i < a.y.n_cols; ++i) {
      const double g = a.gate.row(r)[a.gate.n_cols == 1 ? 0 : i];
      a.y.row(r)[i] = static_cast<float>(a.y.row(r)[i] / (1.0 + std::exp(-g)));
    }
  }
}

void tap_sum(const TapSumArgs& a) {
  for (int64_t r = 0; r < a.out.n_rows; ++r) {
    for (int64_t c = 0; c < a.out.n_cols; ++c) {
      double acc = 0.0;
      for (int64_t k = 0; k < a.n_taps; ++k) {
        const auto i = static_cast<size_t>(r * a.n_taps + k);
        acc += double{a.weights[i]} * a.table[int64_t{a.taps[i]} * a.out.n_cols + c];
      }
      a.out.row(r)[c] = static_cast<float>(a.out.row(r)[c] + acc);
    }
  }
}

}  // namespace metrale::cpu::reference
