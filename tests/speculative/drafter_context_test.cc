// The drafter-context switches: "1" on, "0" off, anything else an error naming the flag or the
// variable; defaults on; the environment under the flags; the list form.
#include "speculative/drafter_context.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "support/test_support.h"

namespace metrale::speculative {
namespace {

using test::error_of;

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(DrafterContext, OnlyOneAndZeroAreSwitchValues) {
  EXPECT_TRUE(parse_switch("X", "1"));
  EXPECT_FALSE(parse_switch("X", "0"));
  for (const char* bad : {"", "true", "yes", "on", " 1", "1 ", "01", "2", "TRUE"}) {
    EXPECT_NE(error_of([&] { parse_switch("METRALE_MTP_CARRY", bad); })
                  .find(std::string("METRALE_MTP_CARRY: expected \"1\" (on) or \"0\" (off), "
                                    "found '") +
                        bad + "'"),
              std::string::npos)
        << bad;
  }
}

TEST(DrafterContext, DefaultsOnThenEnvironmentThenFlags) {
  const DrafterContext d = resolve_drafter_context({}, env_of({}));
  EXPECT_TRUE(d.prefill);
  EXPECT_TRUE(d.carry);
  const DrafterContext no_env = resolve_drafter_context({}, nullptr);
  EXPECT_TRUE(no_env.prefill && no_env.carry);

  const DrafterContext e = resolve_drafter_context({}, env_of({{kMtpCarryEnv, "0"}}));
  EXPECT_TRUE(e.prefill);
  EXPECT_FALSE(e.carry);
  const DrafterContext both =
      resolve_drafter_context({}, env_of({{kMtpCarryEnv, "0"}, {kDrafterPrefillEnv, "0"}}));
  EXPECT_FALSE(both.prefill || both.carry);

  // A flag beats the environment.
  const DrafterContext f = resolve_drafter_context({.carry = "1"}, env_of({{kMtpCarryEnv, "0"}}));
  EXPECT_TRUE(f.carry);
  const DrafterContext g =
      resolve_drafter_context({.prefill = "0"}, env_of({{kDrafterPrefillEnv, "1"}}));
  EXPECT_FALSE(g.prefill);
  // The list form, and a per-switch flag beating it.
  const DrafterContext l = resolve_drafter_context({.context = "carry"}, env_of({}));
  EXPECT_FALSE(l.prefill);
  EXPECT_TRUE(l.carry);
  const DrafterContext m = resolve_drafter_context({.context = "none", .carry = "1"}, env_of({}));
  EXPECT_FALSE(m.prefill);
  EXPECT_TRUE(m.carry);
}

TEST(DrafterContext, BadValuesNameTheirSource) {
  EXPECT_NE(error_of([] {
              resolve_drafter_context({}, env_of({{kDrafterPrefillEnv, "true"}}));
            }).find("METRALE_DRAFTER_PREFILL: expected \"1\" (on) or \"0\" (off), found 'true'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              resolve_drafter_context({}, env_of({{kMtpCarryEnv, ""}}));
            }).find("METRALE_MTP_CARRY: expected"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              resolve_drafter_context({.carry = "yes"}, env_of({}));
            }).find("--mtp-carry: expected \"1\" (on) or \"0\" (off), found 'yes'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              resolve_drafter_context({.prefill = "on"}, env_of({}));
            }).find("--drafter-prefill: expected"),
            std::string::npos);
}

TEST(DrafterContext, ListForm) {
  const DrafterContext a = parse_drafter_context("prefill,carry");
  EXPECT_TRUE(a.prefill && a.carry);
  const DrafterContext b = parse_drafter_context("carry,prefill");
  EXPECT_TRUE(b.prefill && b.carry);
  const DrafterContext p = parse_drafter_context("prefill");
  EXPECT_TRUE(p.prefill);
  EXPECT_FALSE(p.carry);
  const DrafterContext n = parse_drafter_context("none");
  EXPECT_FALSE(n.prefill || n.carry);
  EXPECT_NE(error_of([] {
              parse_drafter_context("prefill,prefill");
            }).find("--drafter-context: 'prefill' appears twice in 'prefill,prefill'"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_drafter_context("prefil"); })
                .find("--drafter-context: expected a list of prefill, carry (or none), found "
                      "'prefil' in 'prefil'"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_drafter_context(""); }).find("found '' in ''"), std::string::npos);
  EXPECT_NE(error_of([] { parse_drafter_context("prefill,none"); }).find("found 'none'"),
            std::string::npos);
}

}  // namespace
}  // namespace metrale::speculative
