#include "hyla/rl/agent_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <vector>

#include "hyla/core/text.h"
#include "hyla/io/file.h"
#include "hyla/train/report.h"

namespace hyla {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;
};

// A line chart over steps, one polyline per series, with its axes and legend.
std::string chart(const std::string& title, const std::vector<Series>& series) {
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const Series& s : series)
    for (auto [x, y] : s.points) {
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  if (x0 > x1) return fmt::format("<h3>{}</h3><p>no data</p>", html_escape(title));
  if (x1 == x0) x1 = x0 + 1;
  const Axis xa = step_axis(x0, x1), ya = value_axis(y0, y1 == y0 ? y0 + 1 : y1);
  const double W = 640, H = 240, L = 60, B = 30, T = 10, R = 150;
  auto px = [&](double x) { return L + (x - xa.lo) / (xa.hi - xa.lo) * (W - L - R); };
  auto py = [&](double y) { return H - B - (y - ya.lo) / (ya.hi - ya.lo) * (H - B - T); };
  std::string svg = fmt::format("<h3>{}</h3><svg width='{}' height='{}' font-size='11' font-family='sans-serif'>",
                                html_escape(title), W, H);
  for (double t : ya.ticks)
    svg += fmt::format("<line x1='{}' x2='{}' y1='{:.1f}' y2='{:.1f}' stroke='#ddd'/><text x='{}' y='{:.1f}' "
                       "text-anchor='end'>{}</text>",
                       L, W - R, py(t), py(t), L - 4, py(t) + 4, tick_label(t, ya.step));
  for (double t : xa.ticks)
    svg += fmt::format("<text x='{:.1f}' y='{}' text-anchor='middle'>{}</text>", px(t), H - B + 14, tick_label(t, xa.step));
  svg += fmt::format("<text x='{}' y='{}' text-anchor='middle'>step</text>", (L + W - R) / 2, H - 2);
  for (size_t i = 0; i < series.size(); ++i) {
    std::string pts;
    for (auto [x, y] : series[i].points) pts += fmt::format("{:.1f},{:.1f} ", px(x), py(y));
    const char* color = kColors[i % std::size(kColors)];
    svg += fmt::format("<polyline fill='none' stroke='{}' stroke-width='1.5' points='{}'/>", color, pts);
    if (series[i].points.size() < 40)
      for (auto [x, y] : series[i].points)
        svg += fmt::format("<circle cx='{:.1f}' cy='{:.1f}' r='2.5' fill='{}'/>", px(x), py(y), color);
    svg += fmt::format("<text x='{}' y='{}' fill='{}'>{}</text>", W - R + 8, T + 14 * (i + 1), color,
                       html_escape(series[i].name));
  }
  return svg + "</svg>";
}

Series column(const std::vector<json>& rows, const std::string& key, const std::string& name) {
  Series s{name, {}};
  for (const json& r : rows)
    if (r.contains(key) && r[key].is_number()) s.points.push_back({r["step"].get<double>(), r[key].get<double>()});
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
  std::vector<Series> dev = {column(rows, "dev_pass@1", "dev pass@1 (all)")};
  if (!rows.empty())
    for (const auto& [key, value] : rows.back().items())
      if (key.rfind("dev_pass@1_", 0) == 0) dev.push_back(column(rows, key, key.substr(11)));
  std::string html = std::string("<!doctype html><html><head><meta charset='utf-8'><title>hyla rl</title>") + kStyle +
                     "</head><body><h1>hyla rl: " + html_escape(run_dir.filename().string()) + "</h1>";
  html += chart("Reward and pass rate of the rollouts", {column(rows, "reward", "mean reward"), column(rows, "pass", "pass (train rollouts)")});
  html += chart("Dev pass@1 (greedy)", dev);
  html += chart("Episode length", {column(rows, "mean_steps", "steps"), column(rows, "mean_tool_calls", "tool calls")});
  html += chart("Groups dropped (equal rewards) and invalid calls",
                {column(rows, "dropped_groups", "dropped share"), column(rows, "invalid_call_rate", "invalid-call rate")});
  html += chart("Throughput (tokens/s)", {column(rows, "rollout_tok_s", "rollout"), column(rows, "update_tok_s", "update")});
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
      for (const auto& [k, v] : s["status"].items()) html += fmt::format("<td>{}</td>", v.get<int64_t>());
      html += "</tr>";
    }
    html += "</table>";
  }
  return html + "</body></html>\n";
}

}  // namespace hyla
