#pragma once
// Agent demonstrations mixed into training (TRAIN.json's "agent", the SFT stage of agentic RL):
// the expert (agent/agent.h's run_expert) plays tasks of the environments' train split, with faults
// injected into its calls and recovered from, and each trajectory becomes one sequence in SPEC §8's
// chat format. Only the assistant's own rows are scored (its replies and <|im_end|>): the system
// turn, the task and the tool observations get no loss, exactly the rows an RL update trains on.
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hyla/data/image_batches.h"
#include "hyla/data/tokenizer.h"
#include "hyla/agent/agent.h"

namespace hyla {

// The scored sequence of a trajectory: inputs ids[0..n-2], targets the next id where the policy
// wrote it, -1 elsewhere.
void append_trajectory(const Trajectory& trajectory, ImageSequences& out);

class AgentDemoSampler {
 public:
  // The tokenizer must outlive the sampler.
  AgentDemoSampler(const std::vector<std::string>& environments, double fault_share, const Tokenizer& tokenizer,
                   uint64_t training_seed);
  // Demonstrations (environments in turn, tasks from the seed stream) until they hold `rows` rows,
  // at least one.
  void next(int64_t rows, ImageSequences& out);
  nlohmann::json state() const { return {{"drawn", drawn_}}; }
  void set_state(const nlohmann::json& state) { drawn_ = state.at("drawn").get<uint64_t>(); }

 private:
  std::vector<std::unique_ptr<Environment>> environments_;
  FaultConfig faults_;
  AgentLimits limits_;
  const Tokenizer& tokenizer_;
  uint64_t first_index_;
  uint64_t drawn_ = 0;
};

}  // namespace hyla
