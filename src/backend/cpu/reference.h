#pragma once
// Scalar references for every CPU kernel: plain loops, written for clarity, with sums in
// double where that makes them the better truth. Tests compare the SIMD kernels (on every
// compiled target) against these; nothing on a hot path calls them.
#include <cstdint>
#include <span>

#include "backend/backend.h"

namespace metrale::cpu::reference {

// y = x W^T (+ bias); W rows decoded with dequantize_row, sums in double.
void linear(ConstRows x, WeightFormat format, const void* w, int64_t n_out, int64_t n_in,
            const float* bias, Rows y);
// The same for a quantized weight: rows decoded with dequantize_row and its QuantParams.
void linear(ConstRows x, WeightFormat format, const void* w, const QuantParams& quant,
            int64_t n_out, int64_t n_in, const float* bias, Rows y);

// Same contract as Backend::rms_norm (gate included: silu in double).
void rms_norm(const RmsNormArgs& a);

// Same contract as Backend::rope: HF's q * cos + rotate_half(q) * sin.
void rope(const RopeArgs& a);

// out = act(gate) * up with std::exp / std::tanh.
void gated_activation(const GatedActivationArgs& a);

// Dense causal attention of one query row against contiguous K/V
// ([n_keys, n_kv_heads, head_dim]) for a query at position `pos` (keys 0..pos exist);
// softmax in double, two passes. `scale` must be resolved (non-zero).
void attention_row(const float* q, const float* k, const float* v, int64_t pos,
                   const AttentionShape& shape, float* out);

// Same contract as Backend::latent_attention after the pass's rows were stored (the cache
// holds them): per row and head, scores summed in double, max, exp, sum, weighted latents in
// double, in key order.
void latent_attention(const LatentAttentionArgs& a);

// Same contract as Backend::causal_conv: sums and silu in double; rows after a kept state
// read it as stored.
void causal_conv(const CausalConvArgs& a);

// Same contract as Backend::delta_rule, token by token in double in HF's recurrent order
// (torch_recurrent_gated_delta_rule): S *= exp(g); kv = S^T k; S += k ((v - kv) beta)^T;
// out = S^T q. A kept state (out[i] set) is stored rounded to its dtype and the next row
// continues from the stored values, as the kernels do.
void delta_rule(const DeltaRuleArgs& a);

// y *= sigmoid(gate) in double (gate per element or one per row).
void sigmoid_mul(const SigmoidMulArgs& a);

// act(x) in double with std::exp / std::tanh / std::erf.
double activate(double x, Activation act);
void activation(const ActivationArgs& a);

// Same contract as Backend::layer_norm: mean and variance in double.
void layer_norm(const LayerNormArgs& a);

// Same contract as Backend::varlen_attention: scores, softmax and weighted values in double.
void varlen_attention(const VarlenAttentionArgs& a);
// Same contract as Backend::tap_sum: each row's weighted taps summed in double.
void tap_sum(const TapSumArgs& a);

}  // namespace metrale::cpu::reference
