#include "io/tokenizer/post_processor.h"

#include <map>

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
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> parts) : parts_(std::move(parts)) {}
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
int32_t pair_id(const Json& j, const char* key, const std::string& where) {
  const Json& v = field(j, key, where);
  METRALE_CHECK(v.is_array() && v.size() == 2 && v[1].is_number_integer(), where, ".", key,
                ": expected [token, id], found ", v.dump());
  return v[1].get<int32_t>();
}

std::unique_ptr<PostProcessor> make_template(const Json& j, const std::string& where) {
  std::map<std::string, std::vector<int32_t>> specials;
  if (auto it = j.find("special_tokens"); it != j.end() && !it->is_null()) {
    METRALE_CHECK(it->is_object(), where, ".special_tokens: expected an object, found ", describe(*it));
    for (auto s = it->begin(); s != it->end(); ++s) {
      const std::string at = where + ".special_tokens['" + s.key() + "']";
      const Json& ids = get_array(*s, "ids", at);
      std::vector<int32_t> v;
      for (const Json& id : ids) {
        METRALE_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0, at, ".ids: expected non-negative ids, found ",
                      id.dump());
        v.push_back(id.get<int32_t>());
      }
      specials[s.key()] = std::move(v);
    }
  }
  const Json& single = get_array(j, "single", where);
  std::vector<int32_t> prefix, suffix;
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string at = where + ".single[" + std::to_string(i) + "]";
    const Json& piece = single[i];
    if (piece.contains("Sequence")) {
      METRALE_CHECK(!seen_sequence, at, ": the single template holds more than one sequence");
      seen_sequence = true;
      continue;
    }
    METRALE_CHECK(piece.contains("SpecialToken"), at, ": expected a Sequence or SpecialToken piece, found ",
                  piece.dump());
    const std::string name = get_string(piece["SpecialToken"], "id", at + ".SpecialToken");
    auto it = specials.find(name);
    METRALE_CHECK(it != specials.end(), at, ": special token '", name, "' is missing from special_tokens");
    auto& dst = seen_sequence ? suffix : prefix;
    dst.insert(dst.end(), it->second.begin(), it->second.end());
  }
  return std::make_unique<WrapProcessor>(std::move(prefix), std::move(suffix));
}

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const Json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, where);
  if (type == "ByteLevel") return std::make_unique<WrapProcessor>(std::vector<int32_t>{}, std::vector<int32_t>{});
  if (type == "TemplateProcessing") return make_template(j, where);
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    return std::make_unique<WrapProcessor>(std::vector<int32_t>{pair_id(j, "cls", where)},
                                           std::vector<int32_t>{pair_id(j, "sep", where)});
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PostProcessor>> parts;
    const Json& list = get_array(j, "processors", where);
    for (size_t i = 0; i < list.size(); ++i) {
      auto p = make_post_processor(list[i], where + ".processors[" + std::to_string(i) + "]");
      if (p) parts.push_back(std::move(p));
    }
    return std::make_unique<SequenceProcessor>(std::move(parts));
  }
  throw make_error(where, ": unsupported post-processor type '", type,
                   "' (supported: ByteLevel, TemplateProcessing, BertProcessing, RobertaProcessing, Sequence)");
}

}  // namespace metrale::tok
