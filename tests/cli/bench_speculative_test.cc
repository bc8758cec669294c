// `metrale bench --speculative ngram`: the speculative runs beside the plain ones, as JSON —
// tokens/s of both, the acceptance, and outputs identical (no timing is asserted).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_run.h"

namespace metrale {
namespace {

TEST(BenchSpeculative, ReportsBothRunsAndTheirAcceptance) {
  const CliRun r =
      run_metrale("bench",
                  {"--model", "models/demo", "--speculative", "ngram", "--draft-tokens", "3",
                   "--batch", "1,2", "--prefill", "8", "--decode-tokens", "24", "--reps", "1",
                   "--no-bandwidth", "--threads", "1", "--json"},
                  /*with_stderr=*/false);
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const nlohmann::json& s = j.at("speculative");
  EXPECT_EQ(s.at("kind"), "ngram");
  EXPECT_EQ(s.at("draft_tokens"), 3);
  EXPECT_GT(s.at("prompt_tokens").get<int>(), 0);
  for (const char* b : {"1", "2"}) {
    const nlohmann::json& run = s.at("batches").at(b);
    EXPECT_TRUE(run.at("identical").get<bool>()) << b;
    EXPECT_GT(run.at("off_tps").get<double>(), 0) << b;
    EXPECT_GT(run.at("on_tps").get<double>(), 0) << b;
    EXPECT_GE(run.at("drafted").get<int64_t>(), run.at("accepted").get<int64_t>()) << b;
    EXPECT_GT(run.at("verify_steps").get<int64_t>(), 0) << b;
  }
}

TEST(BenchSpeculative, AnUnknownKindIsAnErrorNamingTheFlag) {
  const CliRun r = run_metrale("bench", {"--model", "models/demo", "--speculative", "lookahead",
                                         "--no-bandwidth", "--batch", "1", "--prefill", "8"});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("--speculative 'lookahead'"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace metrale
