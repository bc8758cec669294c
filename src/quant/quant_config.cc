#include "quant/quant_config.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "io/json/json_fields.h"
#include "io/json/json_parse.h"
#include "quant/py_regex.h"

namespace metrale {
namespace {

using Kind = ModuleScheme::Kind;

// One entry of a target or ignore list in its dialect's matching rule.
struct Matcher {
  enum class Rule : uint8_t { kExact, kRegex, kClassLinear, kGlob, kModulePath };
  Rule rule = Rule::kExact;
  std::string text;  // the entry as written
  std::shared_ptr<PyRegex> regex;

  bool matches(std::string_view module) const {
    switch (rule) {
      case Rule::kExact:
        return module == text;
      case Rule::kRegex:
        return regex->match(module);
      case Rule::kClassLinear:
        return true;  // every module a loader asks about is a linear
      case Rule::kGlob:
        return fnmatch(text, module);
      case Rule::kModulePath:
        // transformers' should_convert_module: the entry as a regex from the start of the
        // name up to a module boundary, or the name ending with the entry.
        return regex->match(module) || module.ends_with(text);
    }
    return false;
  }
};

bool plain_module_path(std::string_view s) {
  if (s.empty() || s.front() == '.' || s.back() == '.') return false;
  char prev = 0;
  for (const char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    if (!ok || (c == '.' && prev == '.')) return false;
    prev = c;
  }
  return true;
}

// Every entry of `list` (strings) as matchers of `rule`; "re:" entries become regexes when
// the dialect allows them. A malformed entry throws naming it.
std::vector<Matcher> read_entries(const JsonList& list, Matcher::Rule rule) {
  std::vector<Matcher> out;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string s = list.string(i);
    Matcher m{rule, s, nullptr};
    if (s.empty()) throw list.error(i, "empty entry");
    if (rule == Matcher::Rule::kExact && s.starts_with("re:")) {
      m.rule = Matcher::Rule::kRegex;
      if (s.size() == 3) throw list.error(i, "empty regex after 're:'");
      m.regex = std::make_shared<PyRegex>(s.substr(3), list.where(i));
    } else if (rule == Matcher::Rule::kExact && s == "Linear") {
      m.rule = Matcher::Rule::kClassLinear;
    } else if (rule == Matcher::Rule::kExact) {
      if (!plain_module_path(s))
        throw list.error(i, "'", s, "' is neither a module name, a 're:' regex nor 'Linear'");
    } else if (rule == Matcher::Rule::kGlob) {
      int depth = 0;
      for (const char c : s) {
        if (c == '[') ++depth;
        if (c == ']' && depth > 0) --depth;
        if (c == ' ' || c == '\t' || c == '\n') throw list.error(i, "glob '", s, "' has a space");
      }
      if (depth != 0) throw list.error(i, "glob '", s, "' has an unclosed '['");
    } else if (rule == Matcher::Rule::kModulePath) {
      m.regex = std::make_shared<PyRegex>("(?:" + s + ")(?:(?<=\\.)|(?=\\.|$))", list.where(i));
    }
    out.push_back(std::move(m));
  }
  return out;
}

struct Group {
  std::string name;  // "config_groups.group_0"
  ModuleScheme scheme;
  std::vector<Matcher> targets;
};

ModuleScheme ct_weights_scheme(const JsonFields& w) {
  ModuleScheme s;
  const int64_t bits = w.req_int("num_bits", 1);
  const std::string type = w.opt_string("type").value_or("int");
  s.strategy = w.opt_string("strategy").value_or("tensor");
  s.symmetric = w.bool_or("symmetric", true);
  s.group_size = w.opt_int("group_size").value_or(0);
  if (s.group_size < 0) throw w.error("group_size", "expected a number >= 1, found ", s.group_size);
  if (const nlohmann::json* a = w.find("actorder")) {
    if (a->is_string()) {
      const std::string v = a->get<std::string>();
      if (v != "group" && v != "weight" && v != "static" && v != "dynamic")
        throw w.error("actorder",
                      "expected null, \"group\", \"weight\", \"static\" or \"dynamic\", "
                      "found \"",
                      v, "\"");
      s.actorder = v == "group" || v == "dynamic";
    } else if (a->is_boolean()) {
      s.actorder = a->get<bool>();
    } else {
      throw w.error("actorder", "expected a string or null, found ", describe_json_value(*a));
    }
  }
  if (const nlohmann::json* b = w.find("block_structure")) {
    if (b->is_array() && b->size() == 2 && (*b)[0].is_number_integer() &&
        (*b)[1].is_number_integer() && (*b)[0].get<int64_t>() > 0 && (*b)[1].get<int64_t>() > 0) {
      s.block = {(*b)[0].get<int64_t>(), (*b)[1].get<int64_t>()};
    } else {
      throw w.error("block_structure", "expected [rows, cols] of positive integers, found ",
                    describe_json_value(*b));
    }
  }
  static const char* const kStrategies[] = {"tensor", "channel", "group",
                                            "block",  "token",   "tensor_group"};
  if (std::find(std::begin(kStrategies), std::end(kStrategies), s.strategy) ==
      std::end(kStrategies))
    throw w.error("strategy", "unknown strategy \"", s.strategy,
                  "\" (expected tensor, channel, group, block or tensor_group)");
  if ((s.strategy == "group" || s.strategy == "tensor_group") && s.group_size == 0)
    throw w.error("group_size", "strategy \"", s.strategy, "\" needs a group_size");
  if (s.strategy == "block" && s.block.empty())
    throw w.error("block_structure", "strategy \"block\" needs a block_structure");
  if (type == "int") {
    if (bits != 4 && bits != 8)
      throw w.error("num_bits", "int weights of ", bits, " bits are not supported (4 or 8)");
    s.kind = Kind::kInt;
    s.bits = static_cast<int>(bits);
  } else if (type == "float") {
    if (bits == 8) {
      s.kind = Kind::kFloat8;
    } else if (bits == 4) {
      if (s.group_size != 16)
        throw w.error("group_size", "4-bit float weights are NVFP4: group_size 16, found ",
                      s.group_size);
      s.kind = Kind::kNvfp4;
    } else {
      throw w.error("num_bits", "float weights of ", bits, " bits are not supported (4 or 8)");
    }
    s.bits = static_cast<int>(bits);
    if (!s.symmetric) throw w.error("symmetric", "float weights must be symmetric");
  } else {
    throw w.error("type", "expected \"int\" or \"float\", found \"", type, "\"");
  }
  return s;
}

}  // namespace

struct QuantConfig::Impl {
  QuantDialect dialect = QuantDialect::kNone;
  std::string method;
  std::string source;
  // compressed-tensors
  std::vector<Group> groups;
  std::vector<std::pair<size_t, size_t>> order;  // (group, target) in matching order
  std::vector<Matcher> ignore;
  // modelopt / fp8: one scheme for every module not excluded
  ModuleScheme all;
  std::string ignore_field;  // "ignore", "exclude_modules", "modules_to_not_convert"
  // fp8 without modules_to_not_convert: transformers' get_keys_to_not_convert keeps the output
  // embedding (lm_head) unquantized, as DeepSeek-V3's FP8 release relies on.
  bool default_skips_lm_head = false;

  void parse_compressed_tensors(const JsonFields& q);
  void parse_modelopt(const JsonFields& q);
  void parse_fp8(const JsonFields& q);
};

void QuantConfig::Impl::parse_compressed_tensors(const JsonFields& q) {
  dialect = QuantDialect::kCompressedTensors;
  const JsonFields cg = q.req_object("config_groups");
  std::vector<std::pair<std::string, const nlohmann::json*>> items;
  for (auto it = cg.object().begin(); it != cg.object().end(); ++it)
    items.emplace_back(it.key(), &it.value());
  if (items.empty()) throw q.error("config_groups", "no groups");
  for (const auto& [key, value] : items) {
    const JsonFields g = cg.req_object(key);
    Group group;
    group.name = g.path();
    const std::optional<JsonFields> w = g.opt_object("weights");
    if (!w) throw g.missing("weights", "the weight scheme of the group");
    group.scheme = ct_weights_scheme(*w);
    group.targets = read_entries(g.req_list("targets"), Matcher::Rule::kExact);
    if (group.targets.empty()) throw g.error("targets", "no targets");
    groups.push_back(std::move(group));
  }
  // compressed-tensors' order over all groups' targets: plain names (exact, class) before
  // regexes, each sorted; the first that matches a module decides its group.
  for (size_t gi = 0; gi < groups.size(); ++gi)
    for (size_t ti = 0; ti < groups[gi].targets.size(); ++ti) order.push_back({gi, ti});
  std::stable_sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
    const Matcher& ma = groups[a.first].targets[a.second];
    const Matcher& mb = groups[b.first].targets[b.second];
    const bool ra = ma.rule == Matcher::Rule::kRegex, rb = mb.rule == Matcher::Rule::kRegex;
    return ra != rb ? rb : ma.text < mb.text;
  });
  if (std::optional<JsonList> ig = q.opt_list("ignore"))
    ignore = read_entries(*ig, Matcher::Rule::kExact);
  ignore_field = "ignore";
}

void QuantConfig::Impl::parse_modelopt(const JsonFields& q) {
  dialect = QuantDialect::kModelOpt;
  const std::string algo = q.req_string("quant_algo");
  all.strategy = "tensor";
  if (algo == "FP8") {
    all.kind = Kind::kFloat8;
  } else if (algo == "FP8_PER_CHANNEL_PER_TOKEN") {
    all.kind = Kind::kFloat8;
    all.strategy = "channel";
  } else if (algo == "FP8_PB_WO" || algo == "fp8_pb_wo") {
    all.kind = Kind::kFloat8;
    all.strategy = "block";
  } else if (algo == "NVFP4" || algo == "W4A16_NVFP4") {  // the latter weight-only: no input_scale
    all.kind = Kind::kNvfp4;
    all.group_size = q.int_or("group_size", 16);
    if (all.group_size != 16)
      throw q.error("group_size", "NVFP4 uses groups of 16, found ", all.group_size);
    all.strategy = "tensor_group";
  } else {
    throw q.error("quant_algo", "ModelOpt algorithm \"", algo,
                  "\" is not supported by this build (FP8, FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, "
                  "NVFP4, W4A16_NVFP4)");
  }
  all.bits = all.kind == Kind::kNvfp4 ? 4 : 8;
  all.rule = "quant_algo " + algo;
  for (const char* key : {"exclude_modules", "ignore"}) {
    if (std::optional<JsonList> ex = q.opt_list(key)) {
      std::vector<Matcher> m = read_entries(*ex, Matcher::Rule::kGlob);
      ignore.insert(ignore.end(), m.begin(), m.end());
      ignore_field = key;
    }
  }
}

void QuantConfig::Impl::parse_fp8(const JsonFields& q) {
  dialect = QuantDialect::kFp8Block;
  const std::string fmt = q.opt_string("fmt").value_or("e4m3");
  if (fmt != "e4m3")
    throw q.error("fmt", "only e4m3 fp8 weights are supported, found \"", fmt, "\"");
  if (std::optional<std::string> act = q.opt_string("activation_scheme")) {
    if (*act != "dynamic" && *act != "static")
      throw q.error("activation_scheme", "expected \"dynamic\" or \"static\", found \"", *act,
                    "\"");
  }
  all.kind = Kind::kFloat8;
  all.bits = 8;
  all.rule = "quant_method fp8";
  if (std::optional<std::vector<int64_t>> b = q.opt_int_list("weight_block_size", 1)) {
    if (b->size() != 2)
      throw q.error("weight_block_size", "expected [rows, cols], found ", b->size(), " values");
    all.block = *b;
    all.strategy = "block";
  } else {
    all.strategy = "tensor";
  }
  for (const char* key : {"modules_to_not_convert", "ignored_layers"}) {
    if (std::optional<JsonList> ex = q.opt_list(key)) {
      std::vector<Matcher> m = read_entries(*ex, Matcher::Rule::kModulePath);
      ignore.insert(ignore.end(), m.begin(), m.end());
      ignore_field = key;
    }
  }
  // HfQuantizer.get_modules_to_not_convert: skip_modules None -> the model's default skips.
  default_skips_lm_head =
      !q.has("modules_to_not_convert") || q.object().at("modules_to_not_convert").is_null();
}

QuantConfig::QuantConfig() : impl_(std::make_unique<Impl>()) {}
QuantConfig::~QuantConfig() = default;
QuantConfig::QuantConfig(QuantConfig&&) noexcept = default;
QuantConfig& QuantConfig::operator=(QuantConfig&&) noexcept = default;

QuantConfig QuantConfig::parse(std::string_view quantization_json,
                               const std::filesystem::path& dir) {
  QuantConfig c;
  Impl& impl = *c.impl_;
  nlohmann::json doc;
  std::string source;
  if (!quantization_json.empty()) {
    source = (dir / "config.json").string();
    doc = parse_json(quantization_json, source);
    impl.source = "config.json quantization_config";
  } else {
    const std::filesystem::path legacy = dir / "hf_quant_config.json";
    std::error_code ec;
    if (!std::filesystem::exists(legacy, ec)) return c;
    source = legacy.string();
    std::ifstream in(legacy, std::ios::binary);
    METRALE_CHECK(in.good(), source, ": cannot read");
    std::stringstream ss;
    ss << in.rdbuf();
    const nlohmann::json whole = parse_json(ss.str(), source);
    const JsonFields top(whole, source);
    const JsonFields q = top.req_object("quantization");
    doc = q.object();
    impl.source = "hf_quant_config.json";
    impl.method = "modelopt";
    impl.parse_modelopt(JsonFields(doc, source, "quantization"));
    return c;
  }
  const JsonFields q(doc, source, "quantization_config");
  impl.method = q.req_string("quant_method");
  if (impl.method == "compressed-tensors") {
    impl.parse_compressed_tensors(q);
  } else if (impl.method == "modelopt") {
    impl.parse_modelopt(q);
  } else if (impl.method == "fp8") {
    impl.parse_fp8(q);
  } else {
    throw q.error("quant_method", "quantization method \"", impl.method,
                  "\" is not supported by this build (compressed-tensors, modelopt, fp8)");
  }
  return c;
}

QuantDialect QuantConfig::dialect() const { return impl_->dialect; }
const std::string& QuantConfig::method() const { return impl_->method; }
const std::string& QuantConfig::source() const { return impl_->source; }

ModuleScheme QuantConfig::scheme_for(std::string_view module) const {
  const Impl& impl = *impl_;
  ModuleScheme s;
  if (impl.dialect == QuantDialect::kNone) {
    s.kind = Kind::kAny;
    s.rule = "no quantization config: the tensors decide";
    return s;
  }
  for (const Matcher& m : impl.ignore) {
    if (m.matches(module)) {
      s.rule = impl.ignore_field + " '" + m.text + "'";
      return s;
    }
  }
  if (impl.default_skips_lm_head && module == "lm_head") {
    s.rule = "no modules_to_not_convert: transformers keeps the output embedding unquantized";
    return s;
  }
  if (impl.dialect != QuantDialect::kCompressedTensors) return impl.all;
  for (const auto& [gi, ti] : impl.order) {
    const Group& g = impl.groups[gi];
    const Matcher& m = g.targets[ti];
    if (!m.matches(module)) continue;
    ModuleScheme out = g.scheme;
    out.rule = g.name + " target '" + m.text + "'";
    return out;
  }
  s.rule = "no config group targets it";
  return s;
}

std::string_view quant_dialect_name(QuantDialect d) {
  switch (d) {
    case QuantDialect::kNone:
      return "none";
    case QuantDialect::kCompressedTensors:
      return "compressed-tensors";
    case QuantDialect::kModelOpt:
      return "modelopt";
    case QuantDialect::kFp8Block:
      return "fp8";
  }
  return "?";
}

std::string_view module_kind_name(ModuleScheme::Kind k) {
  switch (k) {
    case Kind::kUnquantized:
      return "unquantized";
    case Kind::kAny:
      return "detected";
    case Kind::kInt:
      return "int";
    case Kind::kFloat8:
      return "float8";
    case Kind::kNvfp4:
      return "nvfp4";
  }
  return "?";
}

bool fnmatch(std::string_view p, std::string_view s) {
  size_t pi = 0, si = 0, star_p = std::string_view::npos, star_s = 0;
  // Matches one set "[...]" at p[pi] against c; returns the index after the set, or npos
  // when it does not match.
  auto set_match = [&](size_t at, char c, size_t& next) {
    size_t i = at + 1;
    bool negate = false;
    if (i < p.size() && p[i] == '!') {
      negate = true;
      ++i;
    }
    bool hit = false;
    bool first = true;
    while (i < p.size() && (first || p[i] != ']')) {
      first = false;
      if (i + 2 < p.size() && p[i + 1] == '-' && p[i + 2] != ']') {
        hit = hit || (c >= p[i] && c <= p[i + 2]);
        i += 3;
      } else {
        hit = hit || c == p[i];
        ++i;
      }
    }
    if (i >= p.size()) return c == '[' && (next = at + 1, true);  // no ']': a literal '['
    next = i + 1;
    return hit != negate;
  };
  while (si < s.size()) {
    size_t next = 0;
    if (pi < p.size() && p[pi] == '*') {
      star_p = pi++;
      star_s = si;
    } else if (pi < p.size() && p[pi] == '?') {
      ++pi;
      ++si;
    } else if (pi < p.size() && p[pi] == '[' && set_match(pi, s[si], next)) {
      pi = next;
      ++si;
    } else if (pi < p.size() && p[pi] != '[' && p[pi] != '*' && p[pi] == s[si]) {
      ++pi;
      ++si;
    } else if (star_p != std::string_view::npos) {
      pi = star_p + 1;
      si = ++star_s;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

}  // namespace metrale
