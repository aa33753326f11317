// The model-loading flags that commands share: expert offload (generate, chat, serve and bench;
// docs/offload.md) and --mmproj (generate, chat, serve and logits; docs/vision.md).
#include "commands.h"
#include "hyla/core/threads.h"

namespace hyla::cli {

void add_expert_memory_options(CLI::App* cmd, ExpertMemoryArgs& args) {
  cmd->add_option("--expert-memory", args.memory,
                  "Keep the routed experts in the model's files and at most SIZE of them resident: bytes with a unit "
                  "(512M, 2GiB) or a percentage of the experts (25%); experts int8 (hyla quantize), MXFP4 or of a GGUF "
                  "quantised type")
      ->type_name("SIZE");
  cmd->add_option("--expert-cache", args.policy, "Which resident expert a miss evicts (with --expert-memory)")
      ->check(CLI::IsMember({"lru", "frequency"}));
  cmd->add_option("--expert-prefetch", args.prefetch,
                  "Prefetch the experts the next layer's router predicts, on an I/O thread (with --expert-memory; "
                  "auto: when --threads leaves a core free for it)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
}

void add_mmproj_option(CLI::App* cmd, std::filesystem::path& mmproj) {
  cmd->add_option("--mmproj", mmproj,
                  "A llama.cpp mmproj file (projector type kimik25) whose vision tower joins a text-only model, "
                  "e.g. a text GGUF");
}

ModelLoadOptions ExpertMemoryArgs::load_options() const {
  ModelLoadOptions options;
  if (!memory.empty())
    options.offload_experts =
        ExpertOffloadOptions{parse_expert_memory(memory), parse_expert_cache_policy(policy),
                             prefetch == "on" || (prefetch == "auto" && num_threads() < physical_cores())};
  return options;
}

}  // namespace hyla::cli
