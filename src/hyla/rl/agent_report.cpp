#include "hyla/rl/agent_report.h"

#include <fmt/format.h>

#include <fstream>
#include <vector>

#include "hyla/core/text.h"
#include "hyla/io/file.h"
#include "hyla/io/svg.h"

namespace hyla {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

// The rows' numbers under `key` over steps; short series get a dot per point.
ChartSeries column(const std::vector<json>& rows, const std::string& key, const std::string& name) {
  ChartSeries s{name, "", {}};
  for (const json& r : rows)
    if (r.contains(key) && r[key].is_number()) s.points.push_back({r["step"].get<double>(), r[key].get<double>()});
  s.dots = s.points.size() < 40;
  return s;
}

constexpr const char* kStyle =
    "<style>body{font-family:sans-serif;margin:24px;max-width:1000px}table{border-collapse:collapse;margin:8px 0}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f4f4f4}td:first-child,"
    "th:first-child{text-align:left}</style>";

}  // namespace

fs::path write_rl_report(const fs::path& run_dir) {
  std::vector<json> rows;
  std::ifstream in(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) rows.push_back(json::parse(line));
  std::vector<ChartSeries> dev = {column(rows, "dev_pass@1", "dev pass@1 (all)")};
  if (!rows.empty())
    for (const auto& [key, value] : rows.back().items())
      if (key.rfind("dev_pass@1_", 0) == 0) dev.push_back(column(rows, key, key.substr(11)));
  std::string html = std::string("<!doctype html><html><head><meta charset='utf-8'><title>hyla rl</title>") + kStyle +
                     "</head><body><h1>hyla rl: " + html_escape(run_dir.filename().string()) + "</h1>";
  html += line_chart_svg({"Reward and pass rate of the rollouts",
                          {column(rows, "reward", "mean reward"), column(rows, "pass", "pass (train rollouts)")}});
  html += line_chart_svg({"Dev pass@1 (greedy)", dev});
  html += line_chart_svg(
      {"Episode length", {column(rows, "mean_steps", "steps"), column(rows, "mean_tool_calls", "tool calls")}});
  html += line_chart_svg({"Groups dropped (equal rewards) and invalid calls",
                          {column(rows, "dropped_groups", "dropped share"),
                           column(rows, "invalid_call_rate", "invalid-call rate")}});
  html += line_chart_svg(
      {"Throughput (tokens/s)", {column(rows, "rollout_tok_s", "rollout"), column(rows, "update_tok_s", "update")}});
  html += "</body></html>\n";
  const fs::path out = run_dir / "report.html";
  write_file_atomic(out, html);
  return out;
}

std::string agent_eval_html(const ojson& results) {
  std::string html = std::string("<!doctype html><html><head><meta charset='utf-8'><title>hyla eval agent</title>") +
                     kStyle + "</head><body><h1>hyla eval agent</h1>";
  html += fmt::format("<p>split {}, {} tasks per environment, {} trials per task, temperature {}, faults in {} of calls.</p>",
                      html_escape(results.value("split", "")), results.value("tasks", 0), results.value("trials", 0),
                      results.value("temperature", 0.0), results.value("fault_share", 0.0));
  const ojson& models = results.at("models");
  if (models.empty()) return html + "</body></html>\n";
  std::vector<std::string> envs;
  for (const auto& [name, s] : models[0]["summary"].items()) envs.push_back(name);
  html += "<h2>pass@1 (95% interval over tasks)</h2><table><tr><th>environment</th>";
  for (const auto& m : models) html += "<th>" + html_escape(m["label"].get<std::string>()) + "</th>";
  html += "</tr>";
  for (const std::string& env : envs) {
    html += "<tr><td>" + html_escape(env) + "</td>";
    for (const auto& m : models) {
      const ojson& s = m["summary"][env];
      html += fmt::format("<td>{:.3f} [{:.3f}, {:.3f}]</td>", s["pass@1"].get<double>(), s["pass@1_interval"][0].get<double>(),
                          s["pass@1_interval"][1].get<double>());
    }
    html += "</tr>";
  }
  html += "</table>";
  for (const auto& m : models) {
    html += "<h2>" + html_escape(m["label"].get<std::string>()) + "</h2><table><tr><th>environment</th>";
    const ojson& first = m["summary"][envs[0]];
    for (const auto& [k, v] : first["pass^k"].items()) html += "<th>pass^" + k + "</th>";
    for (const auto& [k, v] : first["pass@k"].items()) html += "<th>pass@" + k + "</th>";
    html += "<th>steps</th><th>tool calls</th><th>invalid calls</th>";
    for (const auto& [k, v] : first["recovery"].items()) html += "<th>recovery " + html_escape(k) + "</th>";
    html += "<th>transient faults retried</th>";
    for (const auto& [k, v] : first["status"].items()) html += "<th>" + html_escape(k) + "</th>";
    html += "</tr>";
    for (const std::string& env : envs) {
      const ojson& s = m["summary"][env];
      html += "<tr><td>" + html_escape(env) + "</td>";
      for (const auto& [k, v] : s["pass^k"].items()) html += fmt::format("<td>{:.3f}</td>", v.get<double>());
      for (const auto& [k, v] : s["pass@k"].items()) html += fmt::format("<td>{:.3f}</td>", v.get<double>());
      html += fmt::format("<td>{:.2f}</td><td>{:.2f}</td><td>{:.3f}</td>", s["mean_steps"].get<double>(),
                          s["mean_tool_calls"].get<double>(), s["invalid_call_rate"].get<double>());
      for (const auto& [k, v] : s["recovery"].items())
        html += v["rate"].is_null() ? "<td>–</td>"
                                    : fmt::format("<td>{:.2f} ({}/{})</td>", v["rate"].get<double>(), v["recovered"].get<int64_t>(),
                                                  v["episodes"].get<int64_t>());
      const ojson retry = s.value("transient_retry", ojson{{"rate", nullptr}});  // absent before the counter
      html += retry["rate"].is_null() ? "<td>–</td>"
                                      : fmt::format("<td>{:.2f} ({}/{})</td>", retry["rate"].get<double>(),
                                                    retry["retried"].get<int64_t>(), retry["faults"].get<int64_t>());
      for (const auto& [k, v] : s["status"].items()) html += fmt::format("<td>{}</td>", v.get<int64_t>());
      html += "</tr>";
    }
    html += "</table>";
  }
  return html + "</body></html>\n";
}

}  // namespace hyla
