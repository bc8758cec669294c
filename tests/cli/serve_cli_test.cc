// `metrale serve`'s flags that fail before it listens: a reply-parser name it does not know is
// refused naming the flag and the valid names, and so are bad speculative flags (the server
// itself is tested in tests/http and tests/python).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "cli_run.h"

namespace metrale {
namespace {

TEST(ServeCli, UnknownReplyParsersAreRefused) {
  const CliRun tools =
      run_metrale("serve", {"--model", "models/demo", "--port", "0", "--tool-call-parser", "xml"});
  EXPECT_NE(tools.status, 0);
  EXPECT_NE(tools.out.find("--tool-call-parser: unknown tool call format 'xml'"), std::string::npos)
      << tools.out;
  EXPECT_NE(tools.out.find("qwen3_coder"), std::string::npos) << tools.out;

  const CliRun reasoning =
      run_metrale("serve", {"--model", "models/demo", "--port", "0", "--reasoning-parser", "r1"});
  EXPECT_NE(reasoning.status, 0);
  EXPECT_NE(reasoning.out.find("--reasoning-parser: unknown reasoning format 'r1'"),
            std::string::npos)
      << reasoning.out;
}

TEST(ServeCli, BadSpeculativeFlagsAreRefused) {
  const CliRun kind =
      run_metrale("serve", {"--model", "models/demo", "--port", "0", "--speculative", "eagle"});
  EXPECT_NE(kind.status, 0);
  EXPECT_NE(kind.out.find("--speculative 'eagle': expected ngram, mtp or off"), std::string::npos)
      << kind.out;
  const CliRun mtp =
      run_metrale("serve", {"--model", "models/demo", "--port", "0", "--speculative", "mtp"});
  EXPECT_NE(mtp.status, 0);
  EXPECT_NE(mtp.out.find("--speculative mtp: models/demo has no MTP layers"), std::string::npos)
      << mtp.out;
}

// The drafter-context switches: only "1" and "0" read, from a flag or the environment (a flag
// beats it); "off", the empty string are errors naming the flag or variable, never read as 0.
TEST(ServeCli, DrafterContextSwitchesReadOnlyOneOrZero) {
  const std::vector<std::string> base = {"--model", "models/demo",   "--port",
                                         "0",       "--speculative", "ngram"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return run_metrale("serve", args);
  };
  const CliRun flag = with({"--mtp-carry", "yes"});
  EXPECT_NE(flag.status, 0);
  EXPECT_NE(flag.out.find("--mtp-carry: expected \"1\" (on) or \"0\" (off), found 'yes'"),
            std::string::npos)
      << flag.out;
  ::setenv("METRALE_MTP_CARRY", "true", 1);
  const CliRun env = with({});
  ::unsetenv("METRALE_MTP_CARRY");
  EXPECT_NE(env.status, 0);
  EXPECT_NE(env.out.find("METRALE_MTP_CARRY: expected \"1\" (on) or \"0\" (off), found 'true'"),
            std::string::npos)
      << env.out;
  const CliRun prefill = with({"--drafter-prefill", "off"});
  EXPECT_NE(prefill.status, 0);
  EXPECT_NE(prefill.out.find("--drafter-prefill: expected \"1\" (on) or \"0\" (off), found 'off'"),
            std::string::npos)
      << prefill.out;
  ::setenv("METRALE_DRAFTER_PREFILL", "", 1);
  const CliRun empty = with({});
  ::unsetenv("METRALE_DRAFTER_PREFILL");
  EXPECT_NE(empty.status, 0);
  EXPECT_NE(empty.out.find("METRALE_DRAFTER_PREFILL: expected \"1\" (on) or \"0\" (off), found ''"),
            std::string::npos)
      << empty.out;
}

}  // namespace
}  // namespace metrale
