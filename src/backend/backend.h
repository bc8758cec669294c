#pragma once
// Backend: the small interface every compute device implements (docs/architecture.md).
//
//  - memory: allocate() hands out aligned device buffers, tagged with the device they live on;
//    upload / download / copy / zero move bytes (host code never touches a non-host buffer);
//  - supports(op, format, dtype) is asked at load time, so an unsupported combination fails
//    before the first token (require() turns "no" into an Error naming op/format/dtype);
//  - prepare(weight) may repack a weight into the backend's preferred layout and then owns
//    the result (WeightTensor::storage keeps it alive);
//  - a fixed set of coarse ops on f32 activations (Rows, rows.h).
//
// Contracts shared by all ops:
//  - activations are f32; weights come in a WeightFormat (quant/weight_format.h);
//  - a row's result depends only on that row's inputs: not on the thread count, nor on
//    which other rows share the call (decode alone == decode co-batched, chunked prefill ==
//    one-piece prefill), because every reduction runs in a fixed order;
//  - ops allocate nothing on the heap (a backend's scratch grows to the largest call, then
//    stays); shapes are validated once, in the public op (backend.cc), with METRALE_CHECK
//    (cheap, per call, never per element), and a mismatch throws Error naming the tensor.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/buffer.h"
#include "backend/kv_cache.h"
#include "backend/rows.h"
#include "core/dtype.h"
#include "quant/weight_format.h"

namespace metrale {

enum class Op : uint8_t {
  kLinear,           // y = x W^T (+ b)
  kEmbedding,        // rows of a [vocab, dim] table
  kRmsNorm,          // both conventions, optional fused residual add, per-group (qk-norm)
  kRope,             // rotate_half RoPE from cos/sin tables
  kKvStore,          // write K/V rows into pages
  kAttention,        // paged attention over ragged rows (prefill chunks, decode, verify)
  kGatedActivation,  // silu(g) * u, gelu_tanh(g) * u
  kRoute,            // MoE router: softmax, top-k, optional renormalisation
  kMoe,              // MoE experts: grouped by expert, weighted sum per row
  kAdd,              // y += x (a residual add with no norm after it)
  kCausalConv,       // depthwise causal conv1d over each sequence's rows, rolling state, SiLU
  kDeltaRule,        // gated delta rule (Gated DeltaNet): a recurrent state per sequence
  kSigmoidMul,       // y *= sigmoid(gate) (gated attention output, shared-expert gate)
  kLatentAttention,  // MLA over a keys-only latent cache (store, then attend in latent space)
  kLora,             // y += scale_s * B_s (A_s x) per row, s = the row's LoRA slot
  kGatherRows,       // out[i] = x[rows[i]] (the rows a step wants logits for)
  kTokenOverlay,     // LoRA adapters' token overlays on the embedding rows
  kHeadOverlay,      // LoRA adapters' overlays on the logits (a saved lm_head, trainable tokens)
  kMemory,           // upload / download / copy / zero of backend memory
  kRopeRows,         // per-row cos/sin of multimodal (t, h, w) positions (M-RoPE)
  kScatterRows,      // out[rows[i]] (+)= x[i] (embeddings injected into a pass's rows)
  kLayerNorm,        // (x - mean) / sqrt(var + eps) * w (+ b) (vision towers)
  kActivation,       // y = act(x) (a vision MLP's GELU / quick GELU)
  kVarlenAttention,  // non-causal attention within each segment of rows (no KV cache)
  kMergeRows,        // out[i] = x[g i] | x[g i + 1] | ... | x[g i + g - 1] (a patch merger)
  kSegmentSum,       // out[s] += the rows of segment s (pooling hidden states into embeddings)
  kTapSum,           // out[r] += sum_k w[r, k] table[taps[r, k]] (interpolated position tables)
};
inline constexpr int kOpCount = 27;
std::string_view op_name(Op op);

// A linear layer's weight: W is [n_out, n_in] (PyTorch's nn.Linear layout), stored in
// `format`; bias (optional) is [n_out] of bias_dtype (f32 or bf16). A quantized format's
// scales, zero points and input order are in `quant` (quant/weight_format.h).
struct WeightTensor {
  std::string name;  // the safetensors key, for error messages
  WeightFormat format = WeightFormat::kF32;
  int64_t n_out = 0;
  int64_t n_in = 0;
  const void* data = nullptr;  // n_out rows of weight_row_bytes(format, n_in) bytes
  QuantParams quant;           // quantized formats only
  const void* bias = nullptr;
  DType bias_dtype = DType::kF32;
  // Backend-specific packing tag set by prepare(): 0 = plain rows as in the checkpoint
  // (cpu: 1 = bf16 in 16-row tiles, cpu/linear_packed.h). Ops reject a tag they did not
  // produce; embedding() reads a packed table too (a tied lm_head shares the embedding).
  uint32_t packing = 0;
  // Owns what prepare() allocated (null: data/bias point into the caller's memory, which
  // must outlive this tensor).
  std::shared_ptr<const Buffer> storage;
};

// What a backend's linear layers compute in (set when the backend is made, honoured by
// prepare(kCopy) of bf16 weights and prepare() of quantized ones). kF32: f32 activations, HF's
// upcast numerics (the default; quantized weights dequantized exactly). kBF16: for bf16
// weights, input rows rounded to bf16 and bf16 x bf16 products summed in f32 (llama.cpp's BF16
// type); quantized weights as kF32. kInt8: bf16 weights as kBF16; int4 / int8 / nvfp4 weights
// meet input rows quantized to int8 per block of 32 (llama.cpp's Q8_0 activations for its
// Q4_0 / Q8_0 weights), integer products summed exactly, scales applied in f32; fp8 as kF32.
// Results differ from kF32 by the activations' rounding; a row still depends only on itself.
// A backend without such a kernel computes in f32.
// One product of a batch of linear layers (Backend::linears): y = x W^T (+ bias), exactly
// as linear(x, *w, y) computes it.
struct LinearCall {
  ConstRows x;  // [rows, w->n_in]
  const WeightTensor* w = nullptr;
  Rows y;  // [rows, w->n_out]
};

enum class Compute : uint8_t { kF32, kBF16, kInt8 };

enum class PrepareMode : uint8_t {
  kInPlace,  // keep reading the caller's memory (e.g. the safetensors mmap)
  kCopy,     // copy (and repack) into backend memory; the caller may release its source
  // kCopy, but the weight's kernel reads f32 activations whatever the backend's Compute (no
  // rounding of its inputs): for small matrices where rounding would cost accuracy and saves
  // no bandwidth (MLA's per-head absorption).
  kCopyF32Input,
};

// rms_norm conventions: Llama/Qwen/Mistral scale by w; Gemma-style checkpoints store w - 1
// and scale by (1 + w).
enum class NormStyle : uint8_t { kWeight, kOnePlusWeight };

struct RmsNormArgs {
  ConstRows x;
  // Optional fused residual: when residual.data is set, first residual += x, then the
  // norm reads residual (HF: h = h + x; out = norm(h)). Same shape as x.
  Rows residual{};
  Rows out;                       // same shape as x; may alias x
  const float* weight = nullptr;  // [group] f32
  float eps = 1e-6f;
  NormStyle style = NormStyle::kWeight;
  // 0: normalise whole rows. Otherwise normalise each run of `group` values separately
  // (per-head qk-norm: group = head_dim, the same weight for every head).
  int64_t group = 0;
  // Optional gate (Gated DeltaNet's RMSNormGated): when gate.data is set, out = norm(x) * w *
  // silu(gate), gate the same shape as x. Not combined with residual.
  ConstRows gate{};
};

// The cos/sin rows of a rope table (layers/rope_table.h builds them the way HF does):
// rotary_dim / 2 values per position, for positions [0, n_positions).
struct RopeCache {
  const float* cos = nullptr;  // [n_positions, rotary_dim / 2]
  const float* sin = nullptr;
  int64_t rotary_dim = 0;
  int64_t n_positions = 0;
};

struct RopeArgs {
  Rows x;  // [n_tokens, n_heads * head_dim], rotated in place
  int64_t n_heads = 0;
  int64_t head_dim = 0;                // the first table.rotary_dim values of each head rotate
  std::span<const int32_t> positions;  // [n_tokens]
  RopeCache table;
  // Where the rotated values start in each head (MLA: after the qk_nope_head_dim values).
  int64_t offset = 0;
  // false: rotate_half (value i pairs with i + rotary_dim / 2). true: DeepSeek-V3's
  // rope_interleave, adjacent pairs (2i, 2i + 1) rotated by frequency i, left in place (HF's
  // apply_rotary_pos_emb_interleave also moves the evens before the odds; queries and keys
  // move alike, so their dot products are the same).
  bool pairs = false;
};

// The cos/sin rows of a pass's own positions, for multimodal rope (Qwen2-VL's M-RoPE and its
// interleaved form in Qwen3-VL / Qwen3.5): row r, frequency i rotates by the position of axis
// axes[i] (0 = t, 1 = h, 2 = w), freq = float(positions[3 r + axes[i]]) * inv_freq[i], and
// cos / sin = float(cos / sin(double(freq))) * scaling — exactly how RopeTable builds its table
// (so a row whose three positions are equal gets the table's row for that position, bit for
// bit). The rope op then reads these rows with row r's "position" = r.
struct RopeRowsArgs {
  std::span<const int32_t> positions;  // [n_rows * 3] (t, h, w) of each row, each >= 0
  const float* inv_freq = nullptr;     // [half]
  const int32_t* axes = nullptr;       // [half] each 0, 1 or 2
  int64_t half = 0;                    // rotary_dim / 2
  float scaling = 1.0f;                // the table's attention scaling
  Rows cos;                            // [n_rows, half]
  Rows sin;                            // [n_rows, half]
};

struct KvStoreArgs {
  ConstRows k;                     // [n_tokens, n_kv_heads * head_dim]
  ConstRows v;                     // same
  std::span<const int64_t> slots;  // [n_tokens], page * page_size + offset
  KvLayerView cache;
};

// Moves tokens within one layer's cache: for i = 0, 1, ... in order, the K and V (keys only:
// the K) of slot from[i] are copied to slot to[i]. A tree verify's accepted rows move this way
// to follow their context (Model::compact).
struct KvMoveArgs {
  KvLayerView cache;
  std::span<const int64_t> from;  // [n] slots, page * page_size + offset
  std::span<const int64_t> to;    // [n]
};

// Tree verification (speculative/draft_tree.h): the keys of a row that are not stored at their
// own index. Row r at position p sees keys lo..p; keys 0..rows[r].root are stored at their own
// index, and key root + j (1 <= j <= p - root) at index keys[rows[r].begin + j - 1] — a draft
// tree row's ancestors below the tree's root, then the row itself, where the step stored them.
// So a tree row's result is the one the same tokens give at consecutive indices (a chain), bit
// for bit. A row without a tree has root = p. Empty rows: every key at its own index.
struct TreeKeys {
  int32_t root = 0;
  int32_t begin = 0;
};
struct KeyRemap {
  std::span<const TreeKeys> rows;  // [n_rows] or empty
  std::span<const int32_t> keys;   // every remapped index lies in (root, the sequence's seq_len)
  bool empty() const { return rows.empty(); }
};

struct AttentionShape {
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // divides n_heads (GQA); head h reads kv head h / (n_heads / n_kv)
  int64_t head_dim = 0;
  float scale = 0.0f;          // softmax scale; 0 means 1 / sqrt(head_dim)
  int64_t sliding_window = 0;  // 0: none; else a query at p sees keys k with p - k < window
};

// Causal paged attention over the ragged rows of one pass: row r is a query of sequence
// seqs[row_seq[r]] at position positions[r], and sees that sequence's keys [lo, positions[r]]
// (lo = 0, or the window's start). Every key a query sees is already stored (kv_store runs
// first), so prefill chunks (many rows of one sequence), decode (one row per sequence) and
// verify (k rows per sequence) are the same call. A query's result depends only on its
// position and its sequence's cache: not on the other rows, their order or the thread split.
struct AttentionArgs {
  ConstRows q;  // [n_rows, n_heads * head_dim]
  Rows out;     // [n_rows, n_heads * head_dim]
  KvLayerView cache;
  std::span<const KvPageTable> seqs;   // the pass's sequences; seq_len covers every row's key
  std::span<const int32_t> row_seq;    // [n_rows] index into seqs
  std::span<const int32_t> positions;  // [n_rows] in [0, seqs[row_seq[r]].seq_len)
  AttentionShape shape;
  KeyRemap tree;  // tree verification's rows (TreeKeys); empty: none
};

// Multi-head latent attention (DeepSeek-V2/V3 MLA) in latent space, over a keys-only cache of
// one head: each cached token is [latent (kv_rank) | rope key (rope_dim)], the kv_a_layernorm-ed
// latent and the roped key. First this pass's rows `kv` are stored at `slots`; then row r,
// head h, whose query is [q_latent | q_rope] (q_latent: q_nope of head h times the key half of
// kv_b_proj for head h, i.e. the key expansion absorbed into the query; q_rope from q), attends
// causally as
// `attention` does: score(t) = scale * q . cache[t], out = sum_t softmax(score)_t latent[t].
// The caller multiplies out by the value half of kv_b_proj per head. Softmax in f32: the max,
// then the sum of exp(score - max) in key order, then the weighted latents in key order, so a
// row's result depends only on its query and its sequence's cache.
struct LatentAttentionArgs {
  ConstRows q_latent;  // [n_rows, n_heads * kv_rank] the absorbed q_nope of each head
  // [n_rows, n_heads * (nope_dim + rope_dim)] the query as projected (HF's layout): head h's
  // roped part, the rest of q, starts at h * (nope_dim + rope_dim) + nope_dim.
  ConstRows q;
  int64_t nope_dim = 0;
  ConstRows kv;                    // [n_rows, kv_rank + rope_dim] this pass's tokens
  std::span<const int64_t> slots;  // [n_rows] where kv's rows are stored
  Rows out;                        // [n_rows, n_heads * kv_rank]
  KvLayerView cache;               // keys_only, 1 head of kv_rank + rope_dim
  std::span<const KvPageTable> seqs;
  std::span<const int32_t> row_seq;    // [n_rows]
  std::span<const int32_t> positions;  // [n_rows]
  int64_t n_heads = 0;
  int64_t kv_rank = 0;
  float scale = 0.0f;  // the softmax scale (MLA: qk_head_dim^-0.5, YaRN-adjusted)
  KeyRemap tree;       // tree verification's rows (TreeKeys); empty: none
};

enum class Activation : uint8_t {
  kSilu,       // x * sigmoid(x)                        (HF "silu")
  kGeluTanh,   // 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3)))  (HF "gelu_pytorch_tanh")
  kGelu,       // 0.5 x (1 + erf(x / sqrt(2)))          (HF "gelu", torch's nn.GELU())
  kQuickGelu,  // x * sigmoid(1.702 x)                  (HF "quick_gelu")
};
std::string_view activation_name(Activation act);  // HF's spelling ("silu", "gelu", ...)

// y = act(x), element by element (a vision MLP's fc1 output). out may alias x.
struct ActivationArgs {
  ConstRows x;
  Rows out;  // same shape as x
  Activation act = Activation::kGelu;
};

// torch's LayerNorm over each row: (x - mean) / sqrt(var + eps) * weight (+ bias), mean and the
// biased variance over the row's n_cols values, in f32.
struct LayerNormArgs {
  ConstRows x;
  Rows out;                       // same shape as x; may alias x
  const float* weight = nullptr;  // [n_cols]
  const float* bias = nullptr;    // [n_cols] or null
  float eps = 1e-5f;
};

// Non-causal attention within segments of rows, without a KV cache (a vision tower's attention
// over the patches of each image or frame): rows [cu_seqlens[s], cu_seqlens[s + 1]) form segment
// s, and row r of segment s, head h attends to every row of s: out = softmax(scale q k^T) v, all
// heads full (no GQA). Softmax in f32: the max, the sum of exp(score - max) in key order, the
// weighted values in key order, so a row's result depends only on its segment.
struct VarlenAttentionArgs {
  ConstRows q;                          // [n_rows, n_heads * head_dim]
  ConstRows k;                          // [n_rows, n_heads * head_dim]
  ConstRows v;                          // [n_rows, n_heads * head_dim]
  Rows out;                             // [n_rows, n_heads * head_dim]; must not alias q, k or v
  std::span<const int32_t> cu_seqlens;  // [n_segments + 1] 0, ..., n_rows, ascending
  int64_t n_heads = 0;
  int64_t head_dim = 0;
  float scale = 0.0f;  // 0: 1 / sqrt(head_dim)
};

// out[r] += sum over k < n_taps of weights[r n_taps + k] * table[taps[r n_taps + k]]: a learned
// table resampled per row (Qwen3-VL's position embeddings, bilinearly interpolated to each image's
// grid: 4 taps per patch). Per column the taps are summed in f32 in order k = 0, 1, ..., then
// added to out (torch's (table[taps] * weights).sum(1) added to the hidden states).
struct TapSumArgs {
  const float* table = nullptr;  // [table_rows, out.n_cols], contiguous
  int64_t table_rows = 0;
  std::span<const int32_t> taps;   // [out.n_rows * n_taps] rows of table
  std::span<const float> weights;  // [out.n_rows * n_taps]
  int64_t n_taps = 0;
  Rows out;
};

struct GatedActivationArgs {
  ConstRows gate;
  ConstRows up;  // same shape as gate
  Rows out;      // same shape; may alias gate or up
  Activation act = Activation::kSilu;
};

enum class RouteScoring : uint8_t {
  kSoftmax,  // Qwen3-MoE / Mixtral: p = softmax(logits)
  kSigmoid,  // DeepSeek-V3 / GLM-4.5: p = sigmoid(logits), chosen by p + correction_bias
};

// MoE router, in f32. kSoftmax: p = softmax(logits), the top_k largest (descending; ties to
// the lower expert), optionally divided by their sum. kSigmoid (DeepseekV3TopkRouter): p =
// sigmoid(logits); the choice score c = p + correction_bias; the experts form n_group equal
// groups, each scored by the sum of its two largest c; the topk_group best groups are kept
// (ties to the lower group) and the top_k largest c among their experts chosen; the weights are
// the chosen p (not c), divided by (their sum + 1e-20) when normalize, times scale.
struct RouteArgs {
  ConstRows logits;  // [n_rows, n_experts]
  int64_t top_k = 0;
  bool normalize = false;      // norm_topk_prob
  std::span<int32_t> experts;  // [n_rows * top_k] out
  std::span<float> weights;    // [n_rows * top_k] out
  RouteScoring scoring = RouteScoring::kSoftmax;
  std::span<const float> correction_bias;  // kSigmoid: [n_experts] e_score_correction_bias
  int64_t n_group = 1;                     // kSigmoid: divides n_experts, >= 2 experts each
  int64_t topk_group = 1;                  // kSigmoid: in [1, n_group]
  float scale = 1.0f;                      // kSigmoid: routed_scaling_factor
};

// --- LoRA (lora/lora_pool.h) ---
//
// One adapted weight W [n_out, n_in] in a slot pool: every slot s holds A_s [max_rank, n_in]
// and B_s transposed, [max_rank, n_out] (PEFT's lora_A.weight and lora_B.weight^T, zero-padded
// to max_rank),
// of which the first rank[s] ranks are used (0: the slot does not adapt this weight), and a
// scale (alpha / r, or alpha / sqrt(r) under rsLoRA). An MoE layer's experts are n_experts such
// weights per slot, expert e of slot s at index s * n_experts + e.
struct LoraWeights {
  const void* a = nullptr;    // [n_slots * n_experts, max_rank, n_in]
  const void* b = nullptr;    // [n_slots * n_experts, n_out, max_rank]
  DType dtype = DType::kF32;  // kF32 or kBF16
  int64_t n_slots = 0;
  int64_t n_experts = 1;
  int64_t max_rank = 0;
  int64_t n_in = 0;
  int64_t n_out = 0;
  const int32_t* rank = nullptr;  // [n_slots]
  const float* scale = nullptr;   // [n_slots]
};

// y[r] += scale[s] * (B_s (A_s x[r])) for every row r whose slot s = slots[r] is >= 0 and
// adapts the weight (rank[s] > 0); other rows are untouched. In f32 (bf16 weights widened):
// t = A_s x[r] over the used ranks, u = B_s t, then y += u * scale, as PEFT computes
// `result + lora_B(lora_A(x)) * scaling`. Rows of one slot share one pass over its A and B.
struct LoraArgs {
  ConstRows x;                     // [n_rows, n_in]
  Rows y;                          // [n_rows, n_out]
  std::span<const int32_t> slots;  // [n_rows], each in [-1, n_slots)
  const LoraWeights* weights = nullptr;
  int64_t expert = 0;  // MoE: the expert all rows went to (in [0, n_experts))
};

// LoRA token overlays of one slot (lora/lora_pool.h: PEFT's modules_to_save on embed_tokens /
// lm_head, and trainable_token_indices), in backend memory. Empty fields: no such overlay.
struct LoraSlotOverlay {
  const float* embed = nullptr;        // [vocab, hidden] a saved embed_tokens
  const int32_t* token_ids = nullptr;  // [n_tokens] ascending: the trainable tokens
  const float* token_rows = nullptr;   // [n_tokens, hidden] their new embedding rows
  int64_t n_tokens = 0;
  const WeightTensor* head = nullptr;  // [vocab, hidden] a saved lm_head (prepared)
  // The head is the tied embedding: the trainable tokens' logits come from their new rows.
  bool tied_tokens = false;
  bool embeds() const { return embed != nullptr || n_tokens > 0; }
  bool heads() const { return head != nullptr || (tied_tokens && n_tokens > 0); }
};

// For each row r whose slot s = slots[r] >= 0 has an overlay: h[r] = embed_s[ids[r]] when the
// slot saved embed_tokens; then, when ids[r] is one of its trainable tokens, h[r] = that
// token's row. Other rows are untouched.
struct TokenOverlayArgs {
  std::span<const int32_t> ids;    // [n_rows]
  std::span<const int32_t> slots;  // [n_rows], each in [-1, overlays.size())
  std::span<const LoraSlotOverlay> overlays;
  Rows h;  // [n_rows, hidden]
};

// For each row r (the head's input x[r]) whose slot s has a head overlay: a saved lm_head
// recomputes the row's logits (exactly as linear() on that row alone); with a tied head, each
// trainable token t's logit becomes dot(row_t, x[r]), summed in f32 in index order.
struct HeadOverlayArgs {
  ConstRows x;                     // [n_rows, hidden]
  std::span<const int32_t> slots;  // [n_rows]
  std::span<const LoraSlotOverlay> overlays;
  Rows logits;  // [n_rows, vocab]
};

// One routed expert: a gated MLP. gate_up is gate_proj and up_proj stacked along the outputs
// (rows [0, I) gate, [I, 2I) up), down is down_proj.
struct MoeExpertWeights {
  WeightTensor gate_up;  // [2 I, H]
  WeightTensor down;     // [H, I]
};

// out[r] = sum over j of weights[r, j] * down(act(gate(x[r])) * up(x[r])) with the expert
// experts[r, j], summed from zero in ascending expert order (HF's index_add_ order). The rows
// routed to one expert go through its weights together, so each expert's weights are read
// once per call, and only the experts some row chose.
struct MoeArgs {
  ConstRows x;                       // [n_rows, H]
  std::span<const int32_t> experts;  // [n_rows * top_k]
  std::span<const float> weights;    // [n_rows * top_k]
  int64_t top_k = 0;
  std::span<const MoeExpertWeights> expert_weights;  // [n_experts]
  Activation act = Activation::kSilu;
  Rows out;  // [n_rows, H]; must not alias x
  // LoRA on the experts (LoraWeights with n_experts = the experts): each row's slot, and the
  // adapters of gate_up ([2 I, H] per expert) and down ([H, I]); null: none. Added to the
  // expert's gate_up output before the activation and to its down output before the weighting.
  std::span<const int32_t> lora_slots;
  const LoraWeights* gate_up_lora = nullptr;
  const LoraWeights* down_lora = nullptr;
};

// --- recurrent state (hybrid models' Gated DeltaNet layers) ---
//
// The engine keeps each sequence's recurrent state in blocks: one block holds the state of
// every linear-attention layer after some token (engine/state_pool.h); a layer's conv and
// SSM state sit at fixed byte offsets inside every block. A pass hands each op one StateRun
// per sequence: the block to start from and the blocks to write after each of its rows.
struct StateRun {
  const std::byte* in = nullptr;  // the block before the sequence's first row of this pass
  // [the sequence's rows in this pass]: the block receiving the state after row i, or null
  // when that intermediate is not kept. The last is never null. Any of them may equal `in`:
  // an op reads the state it starts from before it writes.
  std::span<std::byte* const> out;
  // Tree verification (engine/model.h StepItem::tree): [rows] the row whose state row i
  // continues from, -1 for `in`; every row's state is then kept (no null out). Empty: each row
  // continues from the one before it.
  std::span<const int32_t> parent;
};

// Where one layer's state of one kind sits in every block of the pass.
struct StateSlice {
  std::span<const StateRun> runs;  // indexed by sequence (AttentionArgs' seqs order)
  size_t offset = 0;               // bytes from a block's start
  // Storage: kF32 or kF16 (computed in f32 either way). The rows after a kept state continue
  // from the stored values (f16: rounded), so a run keeping every state equals one-row calls
  // chained, bit for bit.
  DType dtype = DType::kF32;
};

// Depthwise causal conv1d over each sequence's rows (Gated DeltaNet's conv1d, bias-free):
// for channel c of a row at stream position t, out = act(sum_j weight[j, c] * u[t - K + 1 + j])
// where u is the sequence's input stream: the K - 1 inputs before the pass come from the
// state, the rest are x's rows. The state is those last K - 1 inputs, [K - 1, C] oldest first
// (zero for a fresh sequence). The rows of a sequence are consecutive (row_seq).
struct CausalConvArgs {
  ConstRows x;                       // [n_rows, C]
  Rows out;                          // [n_rows, C]; must not alias x
  const float* weight = nullptr;     // [K, C]: conv1d.weight [C, 1, K] transposed at load
  int64_t kernel = 0;                // K >= 2
  bool silu = true;                  // the activation after the conv (HF: config.hidden_act)
  std::span<const int32_t> row_seq;  // [n_rows]
  StateSlice state;                  // [K - 1, C] per block
};

// The gated delta rule of Qwen3-Next / Qwen3.5 (HF torch_recurrent_gated_delta_rule /
// torch_chunk_gated_delta_rule with use_qk_l2norm_in_kernel), per value head h of a row,
// with key head kh = h / (n_v_heads / n_k_heads):
//   q, k = l2norm(q_kh), l2norm(k_kh)  (x / sqrt(sum x^2 + 1e-6));  q /= sqrt(k_head_dim)
//   g = -exp(a_log[h]) * softplus(a[h] + dt_bias[h]);  beta = sigmoid(b[h])
//   S = exp(g) S;  S += k (beta (v_h - S^T k))^T;  out_h = S^T q
// S is the head's [k_head_dim, v_head_dim] state. The state of one block is
// [n_v_heads, k_head_dim, v_head_dim]. A run whose intermediates are all kept is computed
// token by token (the recurrent form); a longer run that keeps only its last state may use
// the chunked form, equal to the recurrent one within rounding (1e-4 on O(1) data,
// tests/backend/cpu/gated_delta_test.cc; the CPU backend measured it slower and does not use
// it, cpu/gated_delta.h). All in f32; the CPU kernels' exact order is in cpu/gated_delta.cc.
struct DeltaRuleArgs {
  ConstRows q;                     // [n_rows, n_k_heads * k_head_dim] (after the conv)
  ConstRows k;                     // [n_rows, n_k_heads * k_head_dim]
  ConstRows v;                     // [n_rows, n_v_heads * v_head_dim]
  ConstRows a;                     // [n_rows, n_v_heads] in_proj_a's output
  ConstRows b;                     // [n_rows, n_v_heads] in_proj_b's output
  const float* a_log = nullptr;    // [n_v_heads] A_log
  const float* dt_bias = nullptr;  // [n_v_heads]
  int64_t n_k_heads = 0;           // divides n_v_heads
  int64_t n_v_heads = 0;
  int64_t k_head_dim = 0;
  int64_t v_head_dim = 0;
  Rows out;  // [n_rows, n_v_heads * v_head_dim]; may be v itself, not q or k
  std::span<const int32_t> row_seq;  // [n_rows]
  StateSlice state;                  // [n_v_heads, k_head_dim, v_head_dim] per block
};

// y[r, j] *= sigmoid(gate[r, j]), or sigmoid(gate[r, 0]) for every j when gate has one
// column (a per-row scalar gate). sigmoid = 1 / (1 + exp(-x)) in f32, as torch.
struct SigmoidMulArgs {
  ConstRows gate;  // [n_rows, n_cols of y] or [n_rows, 1]; may be y itself
  Rows y;
};

// Watches the ops a backend runs (Backend::set_observer): begin/end bracket each op call,
// `weight` is the weight of a linear or embedding (null otherwise). OpProfiler
// (backend/op_profiler.h) times them for `metrale bench --profile`.
class OpObserver {
 public:
  virtual ~OpObserver() = default;
  virtual void begin(Op op, const WeightTensor* weight) = 0;
  virtual void end(Op op, const WeightTensor* weight) = 0;
};

// The public ops validate their arguments once (shapes, pointers, ranges; a mismatch throws
// Error naming the tensor) and then call the device's do_* implementation, which may assume
// valid arguments. A second backend implements the do_* methods only.
class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;

  // --- memory ---
  // Zero-filled, aligned to at least 64 bytes, tagged with device().
  virtual Buffer allocate(size_t bytes) = 0;
  // Where allocate()'s buffers live (kHost: host code may use them directly).
  virtual Device device() const = 0;
  // Bytes between host memory and this backend's, and within this backend's memory. A host
  // backend's upload / download are memcpy; a device backend's are transfers. Ranges must
  // not overlap (copy with dst == src is nothing). Observed as kMemory.
  void upload(void* dst, const void* host_src, size_t bytes);
  void download(void* host_dst, const void* src, size_t bytes);
  void copy(void* dst, const void* src, size_t bytes);
  void zero(void* dst, size_t bytes);

  // --- capabilities ---
  // `format` matters for kLinear, kEmbedding and kMoe (pass kF32 for others); `dtype` is the
  // activation / cache element type (kF32 today).
  virtual bool supports(Op op, WeightFormat format, DType dtype) const = 0;
  // Throws Error "backend cpu: op linear does not support weight format X with dtype Y
  // (needed by 'tensor')" when unsupported.
  void require(Op op, WeightFormat format, DType dtype, std::string_view needed_by) const;

  // Validates w (shape, pointers, format support) and returns the tensor the ops want.
  WeightTensor prepare(const WeightTensor& w, PrepareMode mode);

  // --- ops ---
  // y[r, o] = sum_i x[r, i] * W[o, i] (+ bias[o]).  x: [rows, n_in], y: [rows, n_out].
  void linear(ConstRows x, const WeightTensor& w, Rows y);
  // Every call as linear() computes it, bit for bit, in one dispatch: many small products
  // with their own weights and inputs (MLA's per-head absorption and expansion) without a
  // barrier each. No call may write what another reads. Observed as one kLinear op on the
  // first call's weight.
  void linears(std::span<const LinearCall> calls);
  // out[r] = table[ids[r]] widened to f32; ids out of range throw.
  void embedding(const WeightTensor& table, std::span<const int32_t> ids, Rows out);
  void rms_norm(const RmsNormArgs& a);
  void rope(const RopeArgs& a);
  void kv_store(const KvStoreArgs& a);
  void kv_move(const KvMoveArgs& a);
  void attention(const AttentionArgs& a);
  void gated_activation(const GatedActivationArgs& a);
  void route(const RouteArgs& a);
  void moe(const MoeArgs& a);
  // y += x, row by row (same shapes).
  void add(ConstRows x, Rows y);
  void causal_conv(const CausalConvArgs& a);
  void delta_rule(const DeltaRuleArgs& a);
  void sigmoid_mul(const SigmoidMulArgs& a);
  void latent_attention(const LatentAttentionArgs& a);
  void lora(const LoraArgs& a);
  // out[i] = x[rows[i]]: whole rows, bit for bit.
  void gather_rows(ConstRows x, std::span<const int32_t> rows, Rows out);
  // out[rows[i]] = x[i], or += x[i] when add (no row named twice).
  void scatter_rows(ConstRows x, std::span<const int32_t> rows, Rows out, bool add);
  void rope_rows(const RopeRowsArgs& a);
  void layer_norm(const LayerNormArgs& a);
  void activation(const ActivationArgs& a);
  void varlen_attention(const VarlenAttentionArgs& a);
  // out[i] = x[g i] | x[g i + 1] | ... | x[g i + g - 1], g = x.n_rows / out.n_rows: groups of g
  // consecutive rows side by side (torch's view(-1, g * C) of contiguous rows).
  void merge_rows(ConstRows x, Rows out);
  // out[s] += x[offsets[s]] + x[offsets[s] + 1] + ... + x[offsets[s + 1] - 1] for every
  // segment s (offsets: [out.n_rows + 1], from 0 up to x.n_rows, non-decreasing; an empty
  // segment leaves its row as it is). Each column is summed in f32 in ascending row order,
  // starting from out's value, so continuing a sum in a later call (the next chunk of a long
  // input) gives the bits one call over all the rows gives. Pools the hidden states of an
  // embedding's rows (engine/embedding.h).
  void segment_sum(ConstRows x, std::span<const int32_t> offsets, Rows out);
  void tap_sum(const TapSumArgs& a);
  void token_overlay(const TokenOverlayArgs& a);
  void head_overlay(const HeadOverlayArgs& a);

  // Every later op call is bracketed by observer->begin/end (nullptr: none). Not owned.
  void set_observer(OpObserver* observer) { observer_ = observer; }
  // The observer set, or null (a circuit program brackets the ops it runs itself: program.h).
  OpObserver* observer() const { return observer_; }

 protected:
  // Per device; arguments already validated by the public op of the same name.
  virtual WeightTensor do_prepare(const WeightTensor& w, PrepareMode mode) = 0;
  virtual void do_linear(ConstRows x, const WeightTensor& w, Rows y) = 0;
  virtual void do_linears(std::span<const LinearCall> calls) = 0;
  virtual void do_embedding(const WeightTensor& table, std::span<const int32_t> ids, Rows out) = 0;
  virtual void do_rms_norm(const RmsNormArgs& a) = 0;
  virtual void do_rope(const RopeArgs& a) = 0;
  virtual void do_kv_store(const KvStoreArgs& a) = 0;
  virtual void do_kv_move(const KvMoveArgs& a) = 0;
  virtual void do_attention(const AttentionArgs& a) = 0;
  virtual void do_gated_activation(const GatedActivationArgs& a) = 0;
  virtual void do_route(const RouteArgs& a) = 0;
  virtual void do_moe(const MoeArgs& a) = 0;
  virtual void do_add(ConstRows x, Rows y) = 0;
  virtual void do_causal_conv(const CausalConvArgs& a) = 0;
  virtual void do_delta_rule(const DeltaRuleArgs& a) = 0;
  virtual void do_sigmoid_mul(const SigmoidMulArgs& a) = 0;
  virtual void do_latent_attention(const LatentAttentionArgs& a) = 0;
  virtual void do_lora(const LoraArgs& a) = 0;
  virtual void do_gather_rows(ConstRows x, std::span<const int32_t> rows, Rows out) = 0;
  virtual void do_scatter_rows(ConstRows x, std::span<const int32_t> rows, Rows out, bool add) = 0;
  virtual void do_rope_rows(const RopeRowsArgs& a) = 0;
  virtual void do_layer_norm(const LayerNormArgs& a) = 0;
  virtual void do_activation(const ActivationArgs& a) = 0;
  virtual void do_varlen_attention(const VarlenAttentionArgs& a) = 0;
  virtual void do_merge_rows(ConstRows x, Rows out) = 0;
  virtual void do_segment_sum(ConstRows x, std::span<const int32_t> offsets, Rows out) = 0;
  virtual void do_tap_sum(const TapSumArgs& a) = 0;
  virtual void do_token_overlay(const TokenOverlayArgs& a) = 0;
  virtual void do_head_overlay(const HeadOverlayArgs& a) = 0;
  virtual void do_upload(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void do_download(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void do_copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void do_zero(void* dst, size_t bytes) = 0;
  // Whether ops can read w as its packing tag (WeightTensor::packing) says: the tags this
  // backend's prepare() produces, and 0 (checkpoint rows) for formats that have a kernel on
  // plain rows; a quantized weight passes only as prepare() packed it.
  virtual bool knows_packing(const WeightTensor& w) const = 0;
  // Largest head_dim the attention implementation accepts.
  virtual int64_t max_head_dim() const = 0;
  // linear()'s checks of one product (throws Error naming the weight).
  void check_linear(ConstRows x, const WeightTensor& w, Rows y) const;

 private:
  OpObserver* observer_ = nullptr;
  friend class ObservedOp;
};

// A small array in backend memory, uploaded once at load: norm weights, a conv kernel,
// A_log / dt_bias, a router's correction bias, rope tables. Ops read it every row, so it lives
// where they run; host code keeps no copy it reads instead.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(Backend& backend, std::span<const T> values)
      : size_(static_cast<int64_t>(values.size())) {
    if (values.empty()) return;
    auto buffer = std::make_shared<Buffer>(backend.allocate(values.size_bytes()));
    backend.upload(buffer->data(), values.data(), values.size_bytes());
    data_ = buffer->template as<const T>();
    storage_ = std::move(buffer);
  }
  DeviceArray(Backend& backend, const std::vector<T>& values)
      : DeviceArray(backend, std::span<const T>(values)) {}

  const T* data() const { return data_; }
  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // For ops' arguments (backend memory: not for host code to read on a device backend).
  std::span<const T> span() const { return {data_, static_cast<size_t>(size_)}; }

 private:
  std::shared_ptr<const Buffer> storage_;
  const T* data_ = nullptr;
  int64_t size_ = 0;
};
using DeviceFloats = DeviceArray<float>;

}  // namespace metrale
