#include "backend/cpu/reference.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

namespace metrale::cpu::reference {

void linear(ConstRows x, WeightFormat format, const void* w, int64_t n_out, int64_t n_in,
            const float* bias, Rows y) {
  std::vector<float> row(static_cast<size_t>(n_in));
  const size_t row_bytes = weight_row_bytes(format, n_in);
  for (int64_t o = 0; o < n_out; ++o) {
    dequantize_row(format, static_cast<const char*>(w) + static_cast<size_t>(o) * row_bytes, n_in,
                   row.data());
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
        a.out.row(r)[g0 + i] = (src[g0 + i] * inv) * w;
      }
    }
  }
}

void rope(const RopeArgs& a) {
  const int64_t half = a.table.rotary_dim / 2;
  for (int64_t r = 0; r < a.x.n_rows; ++r) {
    const int64_t pos = a.positions[static_cast<size_t>(r)];
    for (int64_t h = 0; h < a.n_heads; ++h) {
      float* x = a.x.row(r) + h * a.head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float c = a.table.cos[pos * half + i], s = a.table.sin[pos * half + i];
        const float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * c + (-x2) * s;  // rotate_half: first half takes -x2
        x[i + half] = x2 * c + x1 * s;
      }
    }
  }
}

void gated_activation(const GatedActivationArgs& a) {
  for (int64_t r = 0; r < a.gate.n_rows; ++r) {
    for (int64_t i = 0; i < a.gate.n_cols; ++i) {
      const double g = a.gate.row(r)[i];
      double act = 0.0;
      if (a.act == Activation::kSilu) {
        act = g / (1.0 + std::exp(-g));
      } else {
        act = 0.5 * g *
              (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (g + 0.044715 * g * g * g)));
      }
      a.out.row(r)[i] = static_cast<float>(act * a.up.row(r)[i]);
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

}  // namespace metrale::cpu::reference
