#pragma once
// The MTP drafter references (tests/data/fixtures/<dir>/mtp_reference.safetensors, made by
// tools/fixtures/models/mtp_fixtures.py; README.md "MTP drafter references") and a target +
// drafter pair loaded from a fixture.
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/mtp_proposer.h"
#include "fixture_util.h"
#include "io/safetensors/file.h"

namespace metrale::testing {

// "demo_mtp" names the shipped trained pair (models/demo_mtp, tools/demo/train_demo_mtp.py),
// whose drafter reference is tests/data/demo_mtp/mtp_reference.safetensors; any other name is a
// fixture dir of tests/data/fixtures.
inline bool is_demo_mtp(const std::string& name) { return name == "demo_mtp"; }
inline std::string mtp_model_dir(const std::string& name) {
  return is_demo_mtp(name) ? "models/demo_mtp" : fixture_dir(name);
}

// The drafter's reference rows (tools/fixtures/models/mtp_fixtures.py), read as Reference reads
// reference.safetensors.
class MtpReference : public Reference {
 public:
  explicit MtpReference(const std::string& dir)
      : Reference(is_demo_mtp(dir)
                      ? Reference(Path{"tests/data/demo_mtp/mtp_reference.safetensors"})
                      : Reference(dir, "mtp_reference.safetensors")) {}
};

// A fixture's target and its MTP drafter, and the rows the drafter's passes computed by key
// (MtpProposer::set_trace).
struct MtpPair {
  std::unique_ptr<Model> target;
  std::unique_ptr<MtpProposer> drafter;
  std::map<int64_t, std::vector<float>> logits, out;  // by key: the last row computed

  explicit MtpPair(const std::string& dir, MtpOptions options = {}, int n_threads = 1) {
    LoadOptions o;
    o.n_threads = n_threads;
    o.kv_tokens = 128;
    target = Model::load(mtp_model_dir(dir), o);
    drafter = MtpProposer::load(*target, options);
    const int64_t V = target->vocab_size(), H = target->config().hidden_size;
    drafter->set_trace([this, V, H](const speculative::ProposerState&, int64_t key, const float* l,
                                    const float* y) {
      logits[key].assign(l, l + V);
      out[key].assign(y, y + H);
    });
  }
};

// Rows [first, first + n) of a row-major [*, cols] matrix.
inline ConstRows rows_at(const std::vector<float>& m, int64_t first, int64_t n, int64_t cols) {
  return {m.data() + first * cols, n, cols, cols};
}

}  // namespace metrale::testing
