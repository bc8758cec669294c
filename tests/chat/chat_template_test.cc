// Every template of tests/data/chat_templates/ on every fixture conversation, byte for byte
// against transformers' apply_chat_template(..., tokenize=False) (fixtures.json, written by
// tools/fixtures/chat/make_chat_fixtures.py), including the conversations a template refuses.
#include "chat/chat_template.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "support/test_support.h"

namespace metrale::chat {
namespace {

using nlohmann::ordered_json;  // keeps the requests' key order: tools print in that order

const std::string kDir = "tests/data/chat_templates/";

const ordered_json& fixtures() {
  static const ordered_json kDoc = [] {
    std::ifstream in(kDir + "fixtures.json", std::ios::binary);
    EXPECT_TRUE(in.good()) << "cannot open fixtures.json";
    std::stringstream ss;
    ss << in.rdbuf();
    return ordered_json::parse(ss.str());
  }();
  return kDoc;
}

// The clock the fixtures pinned strftime_now to: 2026-03-14 09:26:53, a Saturday.
RenderOptions fixed_clock() {
  RenderOptions o;
  o.now = [] {
    std::tm t{};
    t.tm_year = 2026 - 1900;
    t.tm_mon = 2;
    t.tm_mday = 14;
    t.tm_hour = 9;
    t.tm_min = 26;
    t.tm_sec = 53;
    t.tm_wday = 6;
    t.tm_yday = 72;
    return t;
  };
  return o;
}

ChatTemplate load_template(const std::string& id) {
  const ordered_json& spec = fixtures()["templates"][id];
  if (spec.contains("dir")) return ChatTemplate::load(kDir + spec["dir"].get<std::string>());
  std::map<std::string, std::string> special;
  for (const auto& [k, v] : spec["special_tokens"].items()) special[k] = v.get<std::string>();
  const std::string path = kDir + spec["file"].get<std::string>();
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ChatTemplate::from_string(ss.str(), path, special);
}

size_t first_difference(const std::string& a, const std::string& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

// What our error must carry for a fixture error: raise_exception's own message.
void check_error(const std::string& ours, const std::string& theirs, const std::string& label) {
  const std::string prefix = "TemplateError: ";
  if (theirs.rfind(prefix, 0) == 0) {
    EXPECT_NE(ours.find("raise_exception: " + theirs.substr(prefix.size())), std::string::npos)
        << label << ": ours: " << ours << "\ntransformers: " << theirs;
  }
}

TEST(ChatTemplateFixtures, EveryCaseMatchesTransformers) {
  std::map<std::string, ChatTemplate> templates;
  for (const auto& [id, spec] : fixtures()["templates"].items()) {
    templates.emplace(id, load_template(id));
  }
  const RenderOptions options = fixed_clock();
  size_t rendered = 0;
  size_t refused = 0;
  for (const ordered_json& c : fixtures()["cases"]) {
    const std::string id = c["template"].get<std::string>();
    const std::string label = id + " / " + c["conversation"].get<std::string>() + " / " +
                              c["request"].dump().substr(0, 0) + "add_generation_prompt=" +
                              c["request"]["add_generation_prompt"].dump() +
                              (c["request"].contains("chat_template_kwargs")
                                   ? " " + c["request"]["chat_template_kwargs"].dump()
                                   : "");
    const ChatRequest request = ChatRequest::from_json(c["request"].dump(), "fixture request");
    if (c.contains("expected")) {
      const std::string expected = c["expected"].get<std::string>();
      std::string got;
      try {
        got = templates.at(id).render(request, options);
      } catch (const Error& e) {
        ADD_FAILURE() << label << ": threw " << e.what();
        continue;
      }
      if (got != expected) {
        const size_t at = first_difference(got, expected);
        ADD_FAILURE() << label << ": differs at byte " << at
                      << "\n got: " << got.substr(at > 40 ? at - 40 : 0, 120)
                      << "\nwant: " << expected.substr(at > 40 ? at - 40 : 0, 120);
      } else {
        ++rendered;
      }
    } else {
      const std::string ours = test::error_of([&] { templates.at(id).render(request, options); });
      check_error(ours, c["error"].get<std::string>(), label);
      if (std::getenv("METRALE_CHAT_SHOW_ERRORS") != nullptr) {
        std::printf("%s\n  ours: %s\n  jinja2: %s\n", label.c_str(), ours.c_str(),
                    c["error"].get<std::string>().c_str());
      }
      ++refused;
    }
  }
  EXPECT_EQ(rendered + refused, fixtures()["cases"].size());
  EXPECT_GT(refused, 0u);
}

TEST(ChatTemplateFixtures, SnippetsMatchJinja2) {
  const RenderOptions options = fixed_clock();
  for (const ordered_json& s : fixtures()["snippets"]) {
    const std::string name = s["name"].get<std::string>();
    const Value context = value_from_json(s["context"].dump(), name);
    if (s.contains("expected")) {
      try {
        const Template t(s["template"].get<std::string>(), name);
        EXPECT_EQ(t.render(context.as_dict(), options), s["expected"].get<std::string>()) << name;
      } catch (const Error& e) {
        ADD_FAILURE() << name << ": threw " << e.what();
      }
    } else {
      const std::string ours = test::error_of([&] {
        const Template t(s["template"].get<std::string>(), name);
        t.render(context.as_dict(), options);
      });
      check_error(ours, s["error"].get<std::string>(), name);
    }
  }
}

}  // namespace
}  // namespace metrale::chat
