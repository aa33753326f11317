#pragma once
// Self-contained HTML reports of agents (inline SVG, no scripts, no network): an RL run's curves,
// and `hyla eval agent`'s models side by side.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

namespace hyla {

// RUN_DIR/report.html from RUN_DIR/metrics.jsonl: reward and pass rate per step with dev pass@1,
// steps and tool calls, the share of groups dropped, rollout and update tokens/s.
std::filesystem::path write_rl_report(const std::filesystem::path& run_dir);

// `hyla eval agent`'s page: `results` is {"models": [{"label", "summary": summarize_agent_episodes(...)}], ...}.
std::string agent_eval_html(const nlohmann::ordered_json& results);

}  // namespace hyla
