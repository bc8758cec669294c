// `metrale serve`'s flags that fail before it listens: a reply-parser name it does not know is
// refused naming the flag and the valid names, and so are bad speculative flags (the server
// itself is tested in tests/http and tests/python).
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace metrale
