// `metrale lora audit DIR --model DIR`: reads a PEFT LoRA adapter the way `--lora` would and
// prints what it adapts (every module's rank, alpha, scale and shapes, the token overlays), or
// the first problem, naming the file and the key or field.
#include <cstdio>

#include "cli/command.h"
#include "cli/options.h"
#include "lora/peft_adapter.h"

namespace metrale::cli {
namespace {

struct AuditFlags {
  ModelFlags model;
  std::string adapter;
};

void run_audit(const AuditFlags& f) {
  std::unique_ptr<Model> model = load_model(f.model);
  // A one-slot pool lists what this model lets LoRA adapt.
  const LoraPool& pool = model->enable_lora({.max_loras = 1, .max_rank = 1});
  const PeftAdapter ad = load_peft_adapter(
      f.adapter, std::filesystem::path(f.adapter).filename().string(), pool.model_info());
  std::fputs(audit_report(ad, pool.model_info()).c_str(), stdout);
}

void setup(CLI::App& app) {
  auto* lora = app.add_subcommand("lora", "PEFT LoRA adapters");
  lora->require_subcommand(1);
  auto f = std::make_shared<AuditFlags>();
  auto* audit = lora->add_subcommand("audit", "check an adapter against a model and report it");
  audit
      ->add_option("adapter", f->adapter,
                   "adapter directory (adapter_config.json, "
                   "adapter_model.safetensors)")
      ->required();
  f->model.add_to(*audit);
  audit->callback([f] { run_audit(*f); });
}

METRALE_REGISTER_COMMAND(setup);

}  // namespace
}  // namespace metrale::cli
