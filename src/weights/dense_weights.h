#pragma once
// Typed weights of the dense decoder families (llama, mistral, qwen2, qwen3): the HF
// safetensors names of one layer mapped to the fields the layer reads. Shapes in comments
// use the config's names: H = hidden_size, Q = n_heads * head_dim, KV = n_kv_heads * head_dim,
// I = intermediate_size, V = vocab_size, D = head_dim.
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/config/model_config.h"
#include "io/safetensors/checkpoint.h"
#include "weights/tensor_loader.h"

namespace metrale {


// When the weights are copied into backend memory, q/k/v and gate/up are concatenated
// along their outputs (`qkv`, `gate_up`) so one pass over the weights (and one thread-pool
// split) serves each group; the separate fields then stay empty. Read in place (mmap) the
// checkpoint's tensors cannot be joined, and the separate fields are used instead.
struct DenseLayerWeights {
  NormWeight input_norm;      // [H]  input_layernorm.weight
  WeightTensor qkv;           // [Q + 2 KV, H] q_proj | k_proj | v_proj (copied weights only)
  WeightTensor q;             // [Q, H]  self_attn.q_proj (+ bias for qwen2)
  WeightTensor k;             // [KV, H] self_attn.k_proj
  WeightTensor v;             // [KV, H] self_attn.v_proj
  WeightTensor o;             // [H, Q]  self_attn.o_proj
  NormWeight q_norm;          // [D] qwen3 only (empty otherwise)
  NormWeight k_norm;          // [D]
  NormWeight post_attn_norm;  // [H]  post_attention_layernorm.weight
  WeightTensor gate_up;       // [2 I, H] gate_proj | up_proj (copied weights only)
  WeightTensor gate;          // [I, H] mlp.gate_proj
  WeightTensor up;            // [I, H] mlp.up_proj
  WeightTensor down;          // [H, I] mlp.down_proj
};

struct DenseModelWeights {
  WeightTensor embed;    // [V, H] model.embed_tokens.weight
  std::vector<DenseLayerWeights> layers;
  NormWeight final_norm;  // [H] model.norm.weight
  WeightTensor lm_head;  // [V, H] lm_head.weight, or embed's data when tied
  bool tied = false;
  // Owns the memory the tensors above point into when they were copied out of the mmap.
  std::vector<std::shared_ptr<const Buffer>> storage;
};


// Maps and validates every tensor of a dense checkpoint. Missing, unexpected or misshaped
// tensors throw an Error naming the tensor, the expected and the found shape or dtype.
// `progress` (optional) is called after each tensor with (done bytes, total bytes).
DenseModelWeights load_dense_weights(const ModelConfig& config, const Checkpoint& checkpoint,
                                     Backend& backend, WeightPlacement placement,
                                     void (*progress)(uint64_t done, uint64_t total) = nullptr);

// The model types whose checkpoints load_dense_weights understands.
bool is_dense_model_type(std::string_view model_type);

}  // namespace metrale
