#include "hyla/train/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hyla/core/error.h"
#include "hyla/core/text.h"
#include "hyla/io/file.h"
#include "hyla/io/json_fields.h"
#include "hyla/io/svg.h"

namespace hyla {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Rows: MoE layers; columns: steps in up to 120 bins; colour: max/mean expert load, 1 (balanced)
// white and the run's worst dark red, on a log scale.
std::string expert_load_map(const std::vector<json>& rows) {
  size_t layers = 0;
  for (const json& r : rows)
    if (r.contains("moe")) layers = std::max(layers, r["moe"].size());
  if (layers == 0) return "<p>No MoE layers.</p>";
  const size_t bins = std::min<size_t>(120, rows.size());
  std::vector<std::vector<double>> value(layers, std::vector<double>(bins, 0.0)), count(layers, std::vector<double>(bins, 0.0));
  double top_value = 1.0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!rows[i].contains("moe")) continue;
    const size_t bin = i * bins / rows.size();
    for (size_t l = 0; l < rows[i]["moe"].size(); ++l) {
      const double v = rows[i]["moe"][l].value("max_over_mean", 1.0);
      value[l][bin] += v, count[l][bin] += 1;
      top_value = std::max(top_value, v);
    }
  }
  HeatMap map{.title = "Expert load: max/mean per MoE layer over training",
              .scale = {{255, 255, 255}, {255, 0, 0}},
              .cell_width = 600.0 / double(bins),
              .cell_height = 18,
              .outlined = false,
              .caption = fmt::format("step 1 → {} (left to right); white = balanced (1.0), dark red = {:.2f}",
                                     rows.size(), top_value)};
  for (size_t l = 0; l < layers; ++l) {
    map.rows.push_back(fmt::format("MoE {}", l));
    map.cells.emplace_back(bins);
    for (size_t b = 0; b < bins; ++b) {
      if (count[l][b] == 0) continue;
      const double v = value[l][b] / count[l][b];
      map.cells[l][b] = HeatCell{top_value > 1 ? std::log(v) / std::log(top_value) : 0.0, "",
                                 fmt::format("layer {}, steps bin {}: max/mean {:.2f}", l, b, v)};
    }
  }
  return heat_map_svg(map);
}

}  // namespace

fs::path write_report(const fs::path& run_dir) {
  const fs::path metrics_file = run_dir / "metrics.jsonl";
  HYLA_CHECK(fs::exists(metrics_file), "{}: no metrics.jsonl (not a training run directory)", run_dir.string());
  std::vector<json> rows;
  std::ifstream in(metrics_file);
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    try {
      rows.push_back(json::parse(line));
    } catch (const json::exception& e) {
      fail("{}:{}: not valid JSON: {}", metrics_file.string(), number, e.what());
    }
  }
  json run;
  if (fs::exists(run_dir / "run.json")) run = parse_json_file((run_dir / "run.json").string());
  const double unigram = run.contains("unigram_entropy") ? run["unigram_entropy"].get<double>() : NAN;

  ChartSeries train{"train loss", "#1f77b4", {}}, val{"validation loss", "#d62728", {}, false, true};
  ChartSeries lr{"learning rate", "#2ca02c", {}}, tps{"tokens/s", "#9467bd", {}}, mfu{"MFU (%)", "#ff7f0e", {}};
  std::vector<ChartMark> stages;
  int64_t last_stage = -1;
  double tokens = 0, seconds = 0, peak_low = INFINITY, peak_high = 0;
  for (const json& r : rows) {
    const double step = r.value("step", 0.0);
    if (r.contains("loss") && r["loss"].is_number()) train.points.emplace_back(step, r["loss"].get<double>());
    if (r.contains("val_loss") && r["val_loss"].is_number()) val.points.emplace_back(step, r["val_loss"].get<double>());
    // NAN is a float: as the default it would make value() read the field as float too.
    constexpr double missing = NAN;
    lr.points.emplace_back(step, r.value("lr", missing));
    tps.points.emplace_back(step, r.value("tokens_per_s", missing));
    mfu.points.emplace_back(step, 100 * r.value("mfu", missing));
    const int64_t stage = r.value("stage", int64_t(1));
    if (stage != last_stage)
      stages.push_back({last_stage < 0 ? step : step - 0.5, fmt::format("T={}", r.value("seq_len", int64_t(0)))});
    last_stage = stage;
    if (r.contains("peak_gflops")) {
      peak_low = std::min(peak_low, r["peak_gflops"].get<double>());
      peak_high = std::max(peak_high, r["peak_gflops"].get<double>());
    }
    tokens += r.value("tokens", 0.0);
    seconds += r.value("step_ms", 0.0) / 1e3;
  }
  std::string summary = fmt::format("<tr><td>steps</td><td>{}</td></tr><tr><td>training tokens</td><td>{:.0f}</td></tr>"
                                    "<tr><td>training time (steps only)</td><td>{:.1f} s</td></tr>",
                                    rows.size(), tokens, seconds);
  if (!val.points.empty())
    summary += fmt::format("<tr><td>last validation loss</td><td>{:.4f} (perplexity {:.2f})</td></tr>", val.points.back().second,
                           std::exp(val.points.back().second));
  if (std::isfinite(unigram))
    summary += fmt::format("<tr><td>unigram entropy of the data</td><td>{:.4f} nats</td></tr>", unigram);

  // A resumed run measured its GEMM reference again: then the title gives the range.
  std::string mfu_title = "Model FLOP utilisation (%)";
  if (peak_high > 0) {
    const std::string low = fmt::format("{:.0f}", peak_low), high = fmt::format("{:.0f}", peak_high);
    mfu_title = fmt::format("Model FLOP utilisation (% of {} GFLOP/s, the run's GEMM reference)",
                            low == high ? high : low + "–" + high);
  }
  std::string html = R"svg(<!DOCTYPE html><html><head><meta charset="utf-8"><title>hyla training report</title>
<style>body{font-family:sans-serif;margin:24px;max-width:900px}table{border-collapse:collapse}td{padding:2px 12px;border-bottom:1px solid #eee}pre{background:#f6f6f6;padding:8px;overflow-x:auto}</style></head><body>)svg";
  html += fmt::format("<h1>Training report</h1><p>{}</p><table>{}</table>", html_escape(fs::absolute(run_dir).string()), summary);
  html += "<h2>Loss</h2>" + line_chart_svg({"Loss (nats per token)", {train, val}, stages, unigram, "unigram entropy"});
  html += "<h2>Learning rate</h2>" + line_chart_svg({"Learning rate", {lr}, stages});
  html += "<h2>Throughput</h2>" + line_chart_svg({"Tokens per second", {tps}, stages}) +
          line_chart_svg({mfu_title, {mfu}, stages});
  html += "<h2>Mixture of experts</h2>" + expert_load_map(rows);
  if (run.contains("train"))
    html += "<h2>Configuration</h2><pre>" + html_escape(run.dump(2)) + "</pre>";
  html += "</body></html>\n";
  const fs::path out = run_dir / "report.html";
  write_file_atomic(out, html);
  return out;
}

}  // namespace hyla
