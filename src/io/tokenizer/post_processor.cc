#include "io/tokenizer/post_processor.h"

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

namespace metrale::tok {

namespace {

class WrapProcessor final : public PostProcessor {
 public:
  WrapProcessor(std::vector<int32_t> prefix, std::vector<int32_t> suffix)
      : prefix_(std::move(prefix)), suffix_(std::move(suffix)) {}
  void process(std::vector<int32_t>& ids) const override {
    ids.insert(ids.begin(), prefix_.begin(), prefix_.end());
    ids.insert(ids.end(), suffix_.begin(), suffix_.end());
  }
  std::vector<int32_t> prefix_ids() const override { return prefix_; }
  std::vector<int32_t> suffix_ids() const override { return suffix_; }

 private:
  std::vector<int32_t> prefix_, suffix_;
};

class SequenceProcessor final : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> parts)
      : parts_(std::move(parts)) {}
  void process(std::vector<int32_t>& ids) const override {
    for (const auto& p : parts_) p->process(ids);
  }
  std::vector<int32_t> prefix_ids() const override {
    std::vector<int32_t> all;
    for (auto it = parts_.rbegin(); it != parts_.rend(); ++it) {
      auto p = (*it)->prefix_ids();
      all.insert(all.end(), p.begin(), p.end());
    }
    return all;
  }
  std::vector<int32_t> suffix_ids() const override {
    std::vector<int32_t> all;
    for (const auto& p : parts_) {
      auto s = p->suffix_ids();
      all.insert(all.end(), s.begin(), s.end());
    }
    return all;
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

// Reads a ["token", id] pair (Bert/Roberta "cls" and "sep").
int32_t pair_id(const JsonFields& j, const char* key) {
  const JsonList pair = j.req_list(key);
  if (pair.size() != 2 || !pair[1].is_number_integer() || pair[1].get<int64_t>() < 0 ||
      pair[1].get<int64_t>() > INT32_MAX) {
    throw j.error(key, "expected [token, id] with an id in [0, 2^31), found ",
                  describe_json_value(j.object().at(key)));
  }
  return pair[1].get<int32_t>();
}

std::unique_ptr<PostProcessor> make_template(const JsonFields& j) {
  std::map<std::string, std::vector<int32_t>> specials;
  if (std::optional<JsonFields> tokens = j.opt_object("special_tokens")) {
    for (auto it = tokens->object().begin(); it != tokens->object().end(); ++it) {
      const JsonFields special = tokens->req_object(it.key());
      const std::optional<std::vector<int64_t>> ids = special.opt_int_list("ids", 0);
      if (!ids) throw special.missing("ids", "a list of token ids");
      std::vector<int32_t>& v = specials[it.key()];
      for (int64_t id : *ids) {
        if (id > INT32_MAX) throw special.error("ids", "expected token ids below 2^31, found ", id);
        v.push_back(static_cast<int32_t>(id));
      }
    }
  }
  const JsonList single = j.req_list("single");
  std::vector<int32_t> prefix, suffix;
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const JsonFields piece = single.object(i);
    if (piece.has("Sequence")) {
      if (seen_sequence) throw single.error(i, "the single template holds more than one sequence");
      seen_sequence = true;
      continue;
    }
    if (!piece.has("SpecialToken")) {
      throw single.error(i, "expected a Sequence or SpecialToken piece, found ",
                         describe_json_value(single[i]));
    }
    const std::string name = piece.req_object("SpecialToken").req_string("id");
    auto it = specials.find(name);
    if (it == specials.end())
      throw single.error(i, "special token '", name, "' is missing from special_tokens");
    auto& dst = seen_sequence ? suffix : prefix;
    dst.insert(dst.end(), it->second.begin(), it->second.end());
  }
  return std::make_unique<WrapProcessor>(std::move(prefix), std::move(suffix));
}

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const JsonFields& j) {
  const std::string type = j.req_string("type");
  if (type == "ByteLevel")
    return std::make_unique<WrapProcessor>(std::vector<int32_t>{}, std::vector<int32_t>{});
  if (type == "TemplateProcessing") return make_template(j);
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    return std::make_unique<WrapProcessor>(std::vector<int32_t>{pair_id(j, "cls")},
                                           std::vector<int32_t>{pair_id(j, "sep")});
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PostProcessor>> parts;
    const JsonList list = j.req_list("processors");
    for (size_t i = 0; i < list.size(); ++i) {
      if (std::optional<JsonFields> part = list.opt_object(i))
        parts.push_back(make_post_processor(*part));
    }
    return std::make_unique<SequenceProcessor>(std::move(parts));
  }
  throw j.error(
      "type", "unsupported post-processor type '", type,
      "' (supported: ByteLevel, TemplateProcessing, BertProcessing, RobertaProcessing, Sequence)");
}

}  // namespace metrale::tok
