#include "lora/peft_adapter.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "core/dtype.h"
#include "core/error.h"
#include "io/json/json_fields.h"
#include "io/json/json_parse.h"
#include "io/safetensors/file.h"
#include "quant/py_regex.h"

namespace metrale {
namespace {

constexpr std::string_view kPrefix = "base_model.model.";

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw make_error(p.string(), ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A list of strings, or one string (`as_regex` set), or absent.
struct NameRule {
  bool present = false;
  bool is_regex = false;
  std::string regex;
  std::vector<std::string> names;
};

NameRule read_name_rule(const JsonFields& f, std::string_view key) {
  NameRule r;
  const nlohmann::json* v = f.find(key);
  if (v == nullptr) return r;
  r.present = true;
  if (v->is_string()) {
    r.is_regex = true;
    r.regex = v->get<std::string>();
    return r;
  }
  const JsonList list = f.req_list(key);
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].is_string() || list[i].get<std::string>().empty())
      throw list.error(i, "expected a non-empty module name");
    r.names.push_back(list[i].get<std::string>());
  }
  return r;
}

bool ends_with_module(const std::string& name, const std::string& entry) {
  return name == entry || (name.size() > entry.size() && name.ends_with(entry) &&
                           name[name.size() - entry.size() - 1] == '.');
}

// rank_pattern / alpha_pattern: ordered (key, value) pairs with their compiled regexes.
struct Pattern {
  std::string key;
  double value = 0;
  std::shared_ptr<PyRegex> re;
};

std::vector<Pattern> read_patterns(const nlohmann::ordered_json& ordered, const JsonFields& f,
                                   std::string_view key, bool integer) {
  std::vector<Pattern> out;
  if (!f.has(key)) return out;
  const auto fields = f.req_object(key);
  auto it = ordered.find(std::string(key));
  for (const auto& [k, v] : it->items()) {
    if (integer ? !v.is_number_integer() || v.get<int64_t>() <= 0
                : !v.is_number() || !std::isfinite(v.get<double>()))
      throw fields.error(k, integer ? "expected a positive integer rank" : "expected a number");
    out.push_back(
        {k, v.get<double>(), std::make_shared<PyRegex>("(.*\\.)?(" + k + ")$", fields.where(k))});
  }
  return out;
}

std::optional<double> pattern_value(const std::vector<Pattern>& ps, const std::string& name) {
  for (const Pattern& p : ps)
    if (p.re->match(name, /*full=*/false)) return p.value;
  return std::nullopt;
}

// A tensor of the adapter file widened to f32, checked finite.
std::vector<float> read_f32(const SafetensorsFile& file, const SafetensorsTensorInfo& t) {
  METRALE_CHECK(t.dtype == DType::kF32 || t.dtype == DType::kBF16 || t.dtype == DType::kF16,
                file.path(), ": tensor '", t.name, "' has dtype ", dtype_name(t.dtype),
                ", expected F32, BF16 or F16");
  std::vector<float> out(static_cast<size_t>(t.shape.numel()));
  to_f32(file.bytes(t).data(), t.dtype, out.data(), out.size());
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) {
      throw make_error(file.path(), ": tensor '", t.name, "' holds a non-finite value (", out[i],
                       ") at element ", i);
    }
  }
  return out;
}

std::string shape_str(int64_t a, int64_t b) {
  return "[" + std::to_string(a) + ", " + std::to_string(b) + "]";
}

}  // namespace

int64_t PeftAdapter::max_rank() const {
  int64_t best = 0;
  for (const LoraPair& p : pairs) best = std::max(best, p.rank);
  return best;
}

uint64_t PeftAdapter::bytes() const {
  uint64_t n = tokens.rows.size() + embed_tokens.size() + lm_head.size();
  for (const LoraPair& p : pairs) n += p.a.size() + p.b.size();
  return n * sizeof(float);
}

PeftAdapter load_peft_adapter(const std::filesystem::path& dir, const std::string& name,
                              const LoraModelInfo& model) {
  PeftAdapter ad;
  ad.name = name;
  ad.dir = dir;
  const std::filesystem::path cfg_path = dir / "adapter_config.json";
  const std::string cfg_text = read_file(cfg_path);
  const nlohmann::json cfg_json = parse_json(cfg_text, cfg_path.string());
  const JsonFields cfg(cfg_json, cfg_path.string());
  // The same text in file order, for the pattern dicts (PEFT takes the first match).
  const auto ordered = nlohmann::ordered_json::parse(cfg_text);

  const std::string peft_type = cfg.req_string("peft_type");
  if (peft_type != "LORA")
    throw cfg.error("peft_type", "expected \"LORA\", found \"", peft_type, "\"");
  ad.r = cfg.req_int("r", 1);
  ad.lora_alpha = cfg.opt_number("lora_alpha").value_or(8.0);
  ad.use_rslora = cfg.bool_or("use_rslora", false);
  ad.base_model = cfg.opt_string("base_model_name_or_path").value_or("");
  // What changes the math and is not implemented is refused, not ignored.
  if (cfg.bool_or("use_dora", false)) throw cfg.error("use_dora", "DoRA is not supported");
  if (cfg.bool_or("fan_in_fan_out", false))
    throw cfg.error("fan_in_fan_out", "Conv1D-style (fan_in_fan_out) adapters are not supported");
  if (cfg.bool_or("lora_bias", false))
    throw cfg.error("lora_bias", "LoRA biases are not supported");
  if (const auto b = cfg.opt_string("bias"); b && *b != "none")
    throw cfg.error("bias", "expected \"none\", found \"", *b, "\"");
  for (const char* k : {"layer_replication", "alora_invocation_tokens", "megatron_config"}) {
    if (cfg.has(k)) throw cfg.error(k, "is not supported");
  }

  const NameRule targets = read_name_rule(cfg, "target_modules");
  const NameRule excluded = read_name_rule(cfg, "exclude_modules");
  const NameRule to_save = read_name_rule(cfg, "modules_to_save");
  if (to_save.is_regex) throw cfg.error("modules_to_save", "expected a list of module names");
  const NameRule target_params = read_name_rule(cfg, "target_parameters");
  if (target_params.is_regex) throw cfg.error("target_parameters", "expected a list of names");
  std::optional<PyRegex> target_re;
  if (targets.is_regex && targets.regex != "all-linear")
    target_re.emplace(targets.regex, cfg.where("target_modules"));
  std::optional<PyRegex> exclude_re;
  if (excluded.is_regex) exclude_re.emplace(excluded.regex, cfg.where("exclude_modules"));
  // layers_to_transform: an int or a list of ints; layers_pattern: a string or a list.
  std::vector<int64_t> layers;
  bool use_layers = false;
  if (const nlohmann::json* v = cfg.find("layers_to_transform")) {
    if (v->is_number_integer()) {
      layers.push_back(cfg.req_int("layers_to_transform", 0));
    } else {
      layers = *cfg.opt_int_list("layers_to_transform", 0);
    }
    use_layers = !layers.empty();
  }
  std::vector<std::shared_ptr<PyRegex>> layer_res;
  if (const nlohmann::json* v = cfg.find("layers_pattern"); v != nullptr && use_layers) {
    NameRule lp = read_name_rule(cfg, "layers_pattern");
    if (lp.is_regex) lp.names = {lp.regex};
    for (const std::string& p : lp.names) {
      layer_res.push_back(std::make_shared<PyRegex>("(?:^|.*?\\.)" + p + "\\.(\\d+)\\.",
                                                    cfg.where("layers_pattern")));
    }
  }
  if (layer_res.empty())
    layer_res.push_back(std::make_shared<PyRegex>(".*?\\.[^.]*\\.(\\d+)\\.", "layers"));
  const std::vector<Pattern> rank_pattern = read_patterns(ordered, cfg, "rank_pattern", true);
  const std::vector<Pattern> alpha_pattern = read_patterns(ordered, cfg, "alpha_pattern", false);

  // PEFT's check_target_module_exists, for one module name.
  auto targeted = [&](const std::string& mod) {
    if (exclude_re ? exclude_re->match(mod, true)
                   : std::any_of(excluded.names.begin(), excluded.names.end(),
                                 [&](const std::string& e) { return ends_with_module(mod, e); }))
      return false;
    for (const std::string& m : to_save.names) {
      if (ends_with_module(mod, m) || mod.find(m + ".") == 0 || mod.find("." + m + ".") != mod.npos)
        return false;
    }
    if (!targets.present) return false;
    if (targets.is_regex) {
      if (!target_re) return !mod.ends_with("lm_head");  // "all-linear": every linear but the head
      return target_re->match(mod, true);
    }
    if (std::none_of(targets.names.begin(), targets.names.end(),
                     [&](const std::string& t) { return ends_with_module(mod, t); }))
      return false;
    if (!use_layers) return true;
    for (const auto& re : layer_res) {
      std::string idx;
      if (re->match(mod, false, &idx) && !idx.empty()) {
        return std::find(layers.begin(), layers.end(), std::stoll(idx)) != layers.end();
      }
    }
    return false;
  };

  // Which modules the config adapts (linear targets by name, experts by target_parameters).
  std::vector<bool> wanted(model.modules.size(), false);
  for (size_t i = 0; i < model.modules.size(); ++i) {
    const LoraModule& m = model.modules[i];
    // A linear's weight may be targeted as a parameter too (PEFT's ParamWrapper on a 2-D
    // parameter, e.g. Qwen3-MoE's router "gate.weight"), with the same A / B layout.
    const std::string param = m.kind == LoraModule::Kind::kLinear ? m.name + ".weight" : m.name;
    wanted[i] = m.kind == LoraModule::Kind::kLinear && targeted(m.name);
    for (const std::string& t : target_params.names)
      if (ends_with_module(param, t)) wanted[i] = true;
  }
  // Every list entry names something in the model.
  for (size_t j = 0; j < targets.names.size(); ++j) {
    bool hit = false;
    for (size_t i = 0; i < model.modules.size() && !hit; ++i)
      hit = model.modules[i].kind == LoraModule::Kind::kLinear &&
            ends_with_module(model.modules[i].name, targets.names[j]);
    if (!hit) {
      throw make_error(cfg.where("target_modules"), ": '", targets.names[j],
                       "' matches no module LoRA can adapt in this ", model.model_type,
                       " model (e.g. '", model.modules.empty() ? "" : model.modules[0].name, "')");
    }
  }
  for (const std::string& t : target_params.names) {
    bool hit = false;
    for (const LoraModule& m : model.modules) {
      hit = hit ||
            ends_with_module(m.kind == LoraModule::Kind::kLinear ? m.name + ".weight" : m.name, t);
    }
    if (!hit) {
      throw make_error(cfg.where("target_parameters"), ": '", t,
                       "' matches no parameter LoRA can adapt in this ", model.model_type,
                       " model (a linear's weight, experts.gate_up_proj, experts.down_proj)");
    }
  }

  // The tensors.
  const std::filesystem::path st_path = dir / "adapter_model.safetensors";
  const SafetensorsFile file = SafetensorsFile::open(st_path);
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < model.modules.size(); ++i) by_name[model.modules[i].name] = i;
  struct Found {
    const SafetensorsTensorInfo* a = nullptr;
    const SafetensorsTensorInfo* b = nullptr;
  };
  std::map<size_t, Found> found;
  // Fused experts: both parameters' pairs under one module path, sorted out by shape below.
  std::map<std::string, std::vector<const SafetensorsTensorInfo*>> expert_keys;
  const SafetensorsTensorInfo* tokens_key = nullptr;
  const SafetensorsTensorInfo* embed_key = nullptr;
  const SafetensorsTensorInfo* head_key = nullptr;
  for (const SafetensorsTensorInfo& t : file.tensors()) {
    auto fail = [&](auto&&... why) -> Error {
      return make_error(st_path.string(), ": tensor '", t.name, "': ", why...);
    };
    if (!t.name.starts_with(kPrefix)) throw fail("expected a key starting with '", kPrefix, "'");
    const std::string key = t.name.substr(kPrefix.size());
    if (key == "model.embed_tokens.token_adapter.trainable_tokens_delta") {
      tokens_key = &t;
      continue;
    }
    if (key == "model.embed_tokens.weight" || key == "lm_head.weight") {
      (key == "lm_head.weight" ? head_key : embed_key) = &t;
      continue;
    }
    const bool is_a = key.ends_with(".lora_A.weight"), is_b = key.ends_with(".lora_B.weight");
    if (!is_a && !is_b) {
      throw fail(
          "not a LoRA pair (…lora_A.weight / …lora_B.weight), a trainable-tokens delta "
          "or a saved embed_tokens / lm_head");
    }
    std::string mod = key.substr(0, key.size() - std::string_view(".lora_A.weight").size());
    if (mod.ends_with(".base_layer"))
      mod.resize(mod.size() - std::string_view(".base_layer").size());
    auto it = by_name.find(mod);
    if (it == by_name.end()) {
      const bool experts = by_name.count(mod + ".gate_up_proj") || mod.ends_with(".experts");
      if (!experts) {
        throw fail("the model has no module '", mod, "' that LoRA can adapt (a ", model.model_type,
                   " model's are like '", model.modules.empty() ? "" : model.modules[0].name, "')");
      }
      expert_keys[mod].push_back(&t);
      continue;
    }
    Found& f = found[it->second];
    const SafetensorsTensorInfo*& slot = is_a ? f.a : f.b;
    if (slot != nullptr) throw fail("duplicates '", slot->name, "'");
    slot = &t;
  }
  // Experts: sort each module's keys into (gate_up, down) A/B by shape.
  for (const auto& [mod, keys] : expert_keys) {
    auto gu = by_name.find(mod + ".gate_up_proj");
    auto dn = by_name.find(mod + ".down_proj");
    if (gu == by_name.end() || dn == by_name.end()) {
      throw make_error(st_path.string(), ": tensor '", keys[0]->name,
                       "': the model has no MoE "
                       "experts module '",
                       mod, "'");
    }
    const LoraModule& g = model.modules[gu->second];
    for (const SafetensorsTensorInfo* t : keys) {
      const bool is_a = t->name.ends_with(".lora_A.weight");
      METRALE_CHECK(t->shape.rank() == 2, st_path.string(), ": tensor '", t->name, "' has shape ",
                    t->shape.str(), ", expected 2 dimensions");
      // A [r E, in]: in = H (gate_up) or I (down); B [out, r E]: out = 2 I or H.
      const int64_t d = is_a ? t->shape[1] : t->shape[0];
      const bool gate_up = is_a ? d == g.n_in : d == g.n_out;
      const bool down = is_a ? d == g.n_out / 2 : d == g.n_in;
      if (!gate_up && !down) {
        throw make_error(st_path.string(), ": tensor '", t->name, "' has shape ", t->shape.str(),
                         ", which fits neither experts.gate_up_proj (A [r E, ", g.n_in, "], B [",
                         g.n_out, ", r E]) nor experts.down_proj (A [r E, ", g.n_out / 2, "], B [",
                         g.n_in, ", r E])");
      }
      Found& f = found[gate_up ? gu->second : dn->second];
      const SafetensorsTensorInfo*& slot = is_a ? f.a : f.b;
      if (slot != nullptr) {
        throw make_error(st_path.string(), ": tensor '", t->name, "' duplicates '", slot->name,
                         "' (the same experts parameter)");
      }
      slot = t;
    }
  }

  // Pairs: complete, wanted, and shaped as the config says.
  for (size_t i = 0; i < model.modules.size(); ++i) {
    const LoraModule& m = model.modules[i];
    auto it = found.find(i);
    if (it == found.end()) {
      if (wanted[i]) {
        throw make_error(st_path.string(), ": adapter_config.json targets module '", m.name,
                         "' but the file has no lora_A / lora_B for it");
      }
      continue;
    }
    const Found& f = it->second;
    if (f.a == nullptr || f.b == nullptr) {
      const SafetensorsTensorInfo* have = f.a != nullptr ? f.a : f.b;
      throw make_error(st_path.string(), ": tensor '", have->name, "' has no ",
                       f.a == nullptr ? "lora_A" : "lora_B", " partner");
    }
    if (!wanted[i]) {
      throw make_error(st_path.string(), ": tensor '", f.a->name, "': module '", m.name,
                       "' is not targeted by adapter_config.json (target_modules / "
                       "layers_to_transform / target_parameters)");
    }
    const int64_t rank = static_cast<int64_t>(
        pattern_value(rank_pattern, m.name).value_or(static_cast<double>(ad.r)));
    const double alpha = pattern_value(alpha_pattern, m.name).value_or(ad.lora_alpha);
    const int64_t E = m.n_experts;
    auto check_shape = [&](const SafetensorsTensorInfo& t, int64_t d0, int64_t d1) {
      if (t.shape.rank() != 2 || t.shape[0] != d0 || t.shape[1] != d1) {
        throw make_error(st_path.string(), ": tensor '", t.name, "' has shape ", t.shape.str(),
                         ", expected ", shape_str(d0, d1), " (rank ", rank, " for module '", m.name,
                         "', ", m.n_out, " x ", m.n_in, E > 1 ? " per expert" : "", ")");
      }
    };
    check_shape(*f.a, rank * E, m.n_in);
    check_shape(*f.b, m.n_out, rank * E);
    LoraPair p;
    p.module = i;
    p.rank = rank;
    p.alpha = static_cast<float>(alpha);
    p.scale = static_cast<float>(ad.use_rslora ? alpha / std::sqrt(static_cast<double>(rank))
                                               : alpha / static_cast<double>(rank));
    p.a_key = f.a->name;
    p.b_key = f.b->name;
    p.a = read_f32(file, *f.a);  // [E r, in] is already [E, r, in]
    std::vector<float> b = read_f32(file, *f.b);
    if (E == 1) {
      p.b = std::move(b);
    } else {  // [out, r E] with column j E + e -> [E, out, r]
      p.b.resize(b.size());
      for (int64_t e = 0; e < E; ++e)
        for (int64_t o = 0; o < m.n_out; ++o)
          for (int64_t j = 0; j < rank; ++j)
            p.b[static_cast<size_t>((e * m.n_out + o) * rank + j)] =
                b[static_cast<size_t>(o * rank * E + j * E + e)];
    }
    ad.pairs.push_back(std::move(p));
  }

  // Token overlays.
  const int64_t H = model.hidden, V = model.vocab;
  auto table = [&](const SafetensorsTensorInfo* t, const char* module) {
    std::vector<float> out;
    if (t == nullptr) return out;
    const bool saved =
        std::any_of(to_save.names.begin(), to_save.names.end(),
                    [&](const std::string& s) { return ends_with_module(module, s); });
    if (!saved) {
      throw make_error(st_path.string(), ": tensor '", t->name, "': '", module,
                       "' is not in adapter_config.json's modules_to_save");
    }
    if (t->shape.rank() != 2 || t->shape[0] != V || t->shape[1] != H) {
      throw make_error(st_path.string(), ": tensor '", t->name, "' has shape ", t->shape.str(),
                       ", expected ", shape_str(V, H));
    }
    return read_f32(file, *t);
  };
  for (const std::string& s : to_save.names) {
    const bool known = ends_with_module("model.embed_tokens", s) || ends_with_module("lm_head", s);
    if (!known) {
      throw make_error(cfg.where("modules_to_save"), ": '", s,
                       "' is not supported (only embed_tokens and lm_head)");
    }
    const bool head = ends_with_module("lm_head", s);
    if ((head ? head_key : embed_key) == nullptr) {
      throw make_error(st_path.string(), ": modules_to_save lists '", s, "' but the file has no ",
                       kPrefix, head ? "lm_head.weight" : "model.embed_tokens.weight");
    }
  }
  ad.embed_tokens = table(embed_key, "model.embed_tokens");
  ad.lm_head = table(head_key, "lm_head");

  // trainable_token_indices: a list (the input embedding) or {"embed_tokens": [...]}.
  std::vector<int64_t> token_ids;
  if (const nlohmann::json* v = cfg.find("trainable_token_indices")) {
    if (v->is_array()) {
      token_ids = *cfg.opt_int_list("trainable_token_indices", 0);
    } else {
      const JsonFields tt = cfg.req_object("trainable_token_indices");
      for (const auto& [k, _] : tt.object().items()) {
        if (!ends_with_module("model.embed_tokens", k)) {
          throw tt.error(k, "trainable tokens are supported on embed_tokens only");
        }
        token_ids = *tt.opt_int_list(k, 0);
      }
    }
  }
  if (token_ids.empty() != (tokens_key == nullptr)) {
    throw make_error(st_path.string(), ": ",
                     tokens_key == nullptr
                         ? "adapter_config.json lists trainable_token_indices but "
                           "the file has no trainable_tokens_delta"
                         : "the file has a trainable_tokens_delta but "
                           "adapter_config.json lists no "
                           "trainable_token_indices");
  }
  if (tokens_key != nullptr) {
    const auto n = static_cast<int64_t>(token_ids.size());
    if (tokens_key->shape.rank() != 2 || tokens_key->shape[0] != n || tokens_key->shape[1] != H) {
      throw make_error(st_path.string(), ": tensor '", tokens_key->name, "' has shape ",
                       tokens_key->shape.str(), ", expected ", shape_str(n, H), " (", n,
                       " trainable_token_indices)");
    }
    const std::vector<float> rows = read_f32(file, *tokens_key);
    // Sorted by id, distinct (a repeated index would be ambiguous).
    std::vector<size_t> order(token_ids.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](size_t x, size_t y) { return token_ids[x] < token_ids[y]; });
    for (size_t k = 0; k < order.size(); ++k) {
      const int64_t id = token_ids[order[k]];
      if (id >= V) {
        throw make_error(cfg.where("trainable_token_indices"), ": token id ", id,
                         " is outside the vocabulary of ", V);
      }
      if (k > 0 && token_ids[order[k - 1]] == id) {
        throw make_error(cfg.where("trainable_token_indices"), ": token id ", id,
                         " is listed twice");
      }
      ad.tokens.ids.push_back(static_cast<int32_t>(id));
      ad.tokens.rows.insert(ad.tokens.rows.end(), rows.begin() + static_cast<int64_t>(order[k]) * H,
                            rows.begin() + static_cast<int64_t>(order[k] + 1) * H);
    }
  }
  if (ad.pairs.empty() && ad.tokens.ids.empty() && ad.embed_tokens.empty() && ad.lm_head.empty()) {
    throw make_error(st_path.string(),
                     ": the adapter changes nothing (no LoRA pairs, tokens or "
                     "saved modules)");
  }
  return ad;
}

int64_t peft_max_rank(const std::filesystem::path& dir) {
  const std::filesystem::path p = dir / "adapter_config.json";
  const nlohmann::json j = parse_json(read_file(p), p.string());
  const JsonFields cfg(j, p.string());
  int64_t best = cfg.req_int("r", 1);
  if (const auto rp = cfg.opt_object("rank_pattern")) {
    for (const auto& [k, v] : rp->object().items()) best = std::max(best, rp->req_int(k, 1));
  }
  return best;
}

std::string audit_report(const PeftAdapter& ad, const LoraModelInfo& model) {
  std::ostringstream os;
  os << "adapter '" << ad.name << "' (" << ad.dir.string() << ")\n";
  os << "  base model: " << (ad.base_model.empty() ? "(not named)" : ad.base_model) << "; checked "
     << "against a " << model.model_type << " model, hidden " << model.hidden << ", vocab "
     << model.vocab << "\n";
  os << "  r " << ad.r << ", lora_alpha " << ad.lora_alpha
     << (ad.use_rslora ? ", rsLoRA (scale alpha/sqrt(r))" : ", scale alpha/r") << "\n";
  os << "  " << ad.pairs.size() << " adapted modules, max rank " << ad.max_rank() << ":\n";
  for (const LoraPair& p : ad.pairs) {
    const LoraModule& m = model.modules[p.module];
    os << "    " << m.name << ": rank " << p.rank << ", alpha " << p.alpha << ", scale " << p.scale
       << ", A " << (m.n_experts > 1 ? std::to_string(m.n_experts) + " x " : "")
       << shape_str(p.rank, m.n_in) << ", B " << shape_str(m.n_out, p.rank) << "\n";
  }
  if (!ad.tokens.ids.empty()) {
    os << "  trainable tokens on embed_tokens"
       << (model.tied_embeddings ? " (and the tied lm_head)" : "") << ": " << ad.tokens.ids.size()
       << " ids:";
    for (int32_t id : ad.tokens.ids) os << " " << id;
    os << "\n";
  }
  if (!ad.embed_tokens.empty()) os << "  modules_to_save: embed_tokens (whole table)\n";
  if (!ad.lm_head.empty()) os << "  modules_to_save: lm_head (whole table)\n";
  os << "  " << ad.bytes() << " bytes as f32\n";
  os << "  OK\n";
  return os.str();
}

}  // namespace metrale
