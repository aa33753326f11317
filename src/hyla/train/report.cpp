#include "hyla/train/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hyla/core/error.h"
#include "hyla/io/file.h"
#include "hyla/io/json_fields.h"

namespace hyla {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct Series {
  std::string name, color;
  std::vector<std::pair<double, double>> points;  // (step, value)
  bool dots = false;
};

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

// A line chart of step → value with axes, ticks, stage boundaries and an optional reference line.
std::string chart(const std::string& title, const std::vector<Series>& series, const std::vector<double>& boundaries,
                  double reference = NAN, const std::string& reference_label = "") {
  constexpr double W = 720, H = 260, left = 60, right = 20, top = 30, bottom = 40;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const Series& s : series)
    for (auto [x, y] : s.points) {
      if (!std::isfinite(y)) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  if (std::isfinite(reference)) y0 = std::min(y0, reference), y1 = std::max(y1, reference);
  if (x0 > x1) return fmt::format("<p>{}: no data</p>", escape(title));
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  const double pad = 0.05 * (y1 - y0);
  y0 -= pad, y1 += pad;
  auto X = [&](double x) { return left + (x - x0) / (x1 - x0) * (W - left - right); };
  auto Y = [&](double y) { return top + (1 - (y - y0) / (y1 - y0)) * (H - top - bottom); };
  std::string svg = fmt::format(R"svg(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="11">)svg", W, H);
  svg += fmt::format(R"svg(<text x="{}" y="18" font-size="13" font-weight="bold">{}</text>)svg", left, escape(title));
  for (int i = 0; i <= 4; ++i) {
    const double y = y0 + (y1 - y0) * i / 4;
    svg += fmt::format(R"svg(<line x1="{}" x2="{}" y1="{:.1f}" y2="{:.1f}" stroke="#ddd"/><text x="{}" y="{:.1f}" text-anchor="end">{:.4g}</text>)svg",
                       left, W - right, Y(y), Y(y), left - 4, Y(y) + 4, y);
    const double x = x0 + (x1 - x0) * i / 4;
    svg += fmt::format(R"svg(<text x="{:.1f}" y="{}" text-anchor="middle">{:.0f}</text>)svg", X(x), H - bottom + 16, x);
  }
  svg += fmt::format(R"svg(<text x="{}" y="{}" text-anchor="middle">step</text>)svg", (left + W - right) / 2, H - 6);
  for (double b : boundaries)
    svg += fmt::format(R"svg(<line x1="{0:.1f}" x2="{0:.1f}" y1="{1}" y2="{2}" stroke="#999" stroke-dasharray="4 3"><title>stage boundary at step {3:.0f}</title></line>)svg",
                       X(b), top, H - bottom, b);
  if (std::isfinite(reference))
    svg += fmt::format(R"svg(<line x1="{0}" x2="{1}" y1="{2:.1f}" y2="{2:.1f}" stroke="#c33" stroke-dasharray="6 3"/><text x="{3}" y="{4:.1f}" fill="#c33" text-anchor="end">{5}</text>)svg",
                       left, W - right, Y(reference), W - right - 2, Y(reference) - 4, escape(reference_label));
  int legend = 0;
  for (const Series& s : series) {
    if (s.dots) {
      for (auto [x, y] : s.points)
        if (std::isfinite(y))
          svg += fmt::format(R"svg(<circle cx="{:.1f}" cy="{:.1f}" r="3" fill="{}"><title>step {:.0f}: {:.4f}</title></circle>)svg", X(x), Y(y), s.color, x, y);
    } else {
      std::string path;
      for (auto [x, y] : s.points)
        if (std::isfinite(y)) path += fmt::format("{}{:.1f},{:.1f} ", path.empty() ? "M" : "L", X(x), Y(y));
      svg += fmt::format(R"svg(<path d="{}" fill="none" stroke="{}" stroke-width="1.5"/>)svg", path, s.color);
    }
    svg += fmt::format(R"svg(<rect x="{}" y="{}" width="10" height="10" fill="{}"/><text x="{}" y="{}">{}</text>)svg",
                       W - right - 160, top + 4 + 16 * legend, s.color, W - right - 145, top + 13 + 16 * legend, escape(s.name));
    ++legend;
  }
  return svg + "</svg>";
}

// Rows: MoE layers; columns: steps in up to 120 bins; colour: max/mean expert load.
std::string heat_map(const std::vector<json>& rows) {
  size_t layers = 0;
  for (const json& r : rows)
    if (r.contains("moe")) layers = std::max(layers, r["moe"].size());
  if (layers == 0) return "<p>No MoE layers.</p>";
  const size_t bins = std::min<size_t>(120, rows.size());
  constexpr double cell_h = 18, left = 70, top = 30;
  const double cell_w = 600.0 / double(bins);
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
  std::string svg = fmt::format(R"svg(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="11">)svg",
                                left + 600 + 150, top + cell_h * double(layers) + 40);
  svg += fmt::format(R"svg(<text x="{}" y="18" font-size="13" font-weight="bold">Expert load: max/mean per MoE layer over training</text>)svg", left);
  for (size_t l = 0; l < layers; ++l) {
    svg += fmt::format(R"svg(<text x="{}" y="{:.1f}" text-anchor="end">MoE {}</text>)svg", left - 6, top + cell_h * (double(l) + 0.7), l);
    for (size_t b = 0; b < bins; ++b) {
      if (count[l][b] == 0) continue;
      const double v = value[l][b] / count[l][b];
      // 1 (balanced) is white, the run's worst is dark red, on a log scale.
      const double t = top_value > 1 ? std::log(v) / std::log(top_value) : 0.0;
      const int g = int(255 * (1 - std::clamp(t, 0.0, 1.0)));
      svg += fmt::format(R"svg(<rect x="{:.1f}" y="{:.1f}" width="{:.2f}" height="{}" fill="rgb(255,{},{})"><title>layer {}, steps bin {}: max/mean {:.2f}</title></rect>)svg",
                         left + cell_w * double(b), top + cell_h * double(l), cell_w + 0.3, cell_h - 2, g, g, l, b, v);
    }
  }
  svg += fmt::format(R"svg(<text x="{}" y="{:.1f}">step 1 → {} (left to right); white = balanced (1.0), dark red = {:.2f}</text>)svg", left,
                     top + cell_h * double(layers) + 20, rows.size(), top_value);
  return svg + "</svg>";
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

  Series train{"train loss", "#1f77b4", {}}, val{"validation loss", "#d62728", {}, true}, lr{"learning rate", "#2ca02c", {}};
  Series tps{"tokens/s", "#9467bd", {}}, mfu{"MFU (%)", "#ff7f0e", {}};
  std::vector<double> boundaries;
  int64_t last_stage = -1;
  double tokens = 0, seconds = 0;
  for (const json& r : rows) {
    const double step = r.value("step", 0.0);
    if (r.contains("loss") && r["loss"].is_number()) train.points.emplace_back(step, r["loss"].get<double>());
    if (r.contains("val_loss") && r["val_loss"].is_number()) val.points.emplace_back(step, r["val_loss"].get<double>());
    lr.points.emplace_back(step, r.value("lr", NAN));
    tps.points.emplace_back(step, r.value("tokens_per_s", NAN));
    mfu.points.emplace_back(step, 100 * r.value("mfu", NAN));
    const int64_t stage = r.value("stage", int64_t(1));
    if (last_stage >= 0 && stage != last_stage) boundaries.push_back(step - 0.5);
    last_stage = stage;
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

  std::string html = R"svg(<!DOCTYPE html><html><head><meta charset="utf-8"><title>hyla training report</title>
<style>body{font-family:sans-serif;margin:24px;max-width:900px}table{border-collapse:collapse}td{padding:2px 12px;border-bottom:1px solid #eee}pre{background:#f6f6f6;padding:8px;overflow-x:auto}</style></head><body>)svg";
  html += fmt::format("<h1>Training report</h1><p>{}</p><table>{}</table>", escape(fs::absolute(run_dir).string()), summary);
  html += "<h2>Loss</h2>" + chart("Loss (nats per token)", {train, val}, boundaries, unigram, "unigram entropy");
  html += "<h2>Learning rate</h2>" + chart("Learning rate", {lr}, boundaries);
  html += "<h2>Throughput</h2>" + chart("Tokens per second", {tps}, boundaries) + chart("Model FLOP utilisation (%)", {mfu}, boundaries);
  html += "<h2>Mixture of experts</h2>" + heat_map(rows);
  if (run.contains("train"))
    html += "<h2>Configuration</h2><pre>" + escape(run.dump(2)) + "</pre>";
  html += "</body></html>\n";
  const fs::path out = run_dir / "report.html";
  write_file_atomic(out, html);
  return out;
}

}  // namespace hyla
