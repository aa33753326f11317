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

namespace hyla {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct Series {
  std::string name, color;
  std::vector<std::pair<double, double>> points;  // (step, value)
  bool dots = false;
};

// A stage boundary line, at the step the stage starts, labelled with its sequence length.
struct Stage {
  double step;
  std::string label;
};

double text_width(const std::string& text, double font_size) { return 0.6 * font_size * double(text.size()); }

// A line chart of step → value with axes, round ticks, labelled stage starts and an optional
// reference line. Every value charted here (loss, learning rate, tokens/s, MFU) is non-negative.
std::string chart(const std::string& title, const std::vector<Series>& series, const std::vector<Stage>& stages,
                  double reference = NAN, const std::string& reference_label = "") {
  constexpr double W = 720, H = 270, right = 30, top = 34, bottom = 42, font = 11;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const Series& s : series)
    for (auto [x, y] : s.points) {
      if (!std::isfinite(y)) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  if (std::isfinite(reference)) y0 = std::min(y0, reference), y1 = std::max(y1, reference);
  if (x0 > x1) return fmt::format("<p>{}: no data</p>", html_escape(title));
  if (x1 == x0) x1 = x0 + 1;
  const Axis xa = step_axis(x0, x1), ya = value_axis(y0, y1);
  std::vector<std::string> y_labels;
  double widest = 0;
  for (double t : ya.ticks) {
    y_labels.push_back(tick_label(t, ya.step));
    widest = std::max(widest, text_width(y_labels.back(), font));
  }
  const double left = std::max(40.0, widest + 12);
  auto X = [&](double x) { return left + (x - xa.lo) / (xa.hi - xa.lo) * (W - left - right); };
  auto Y = [&](double y) { return top + (1 - (y - ya.lo) / (ya.hi - ya.lo)) * (H - top - bottom); };
  std::string svg = fmt::format(R"svg(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="{}">)svg", W, H, font);
  svg += fmt::format(R"svg(<text x="{}" y="18" font-size="13" font-weight="bold">{}</text>)svg", left, html_escape(title));
  for (size_t i = 0; i < ya.ticks.size(); ++i)
    svg += fmt::format(R"svg(<line x1="{}" x2="{}" y1="{:.1f}" y2="{:.1f}" stroke="#ddd"/><text x="{}" y="{:.1f}" text-anchor="end">{}</text>)svg",
                       left, W - right, Y(ya.ticks[i]), Y(ya.ticks[i]), left - 5, Y(ya.ticks[i]) + 4, y_labels[i]);
  for (double t : xa.ticks)
    svg += fmt::format(R"svg(<line x1="{0:.1f}" x2="{0:.1f}" y1="{1}" y2="{2}" stroke="#999"/><text x="{0:.1f}" y="{3}" text-anchor="middle">{4}</text>)svg",
                       X(t), H - bottom, H - bottom + 4, H - bottom + 16, tick_label(t, xa.step));
  svg += fmt::format(R"svg(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#999"/>)svg", left, top,
                     W - left - right, H - top - bottom);
  svg += fmt::format(R"svg(<text x="{}" y="{}" text-anchor="middle">step</text>)svg", (left + W - right) / 2, H - 8);
  for (const Stage& st : stages) {
    if (st.step > x0)  // the first stage starts at the left edge: label only
      svg += fmt::format(R"svg(<line x1="{0:.1f}" x2="{0:.1f}" y1="{1}" y2="{2}" stroke="#999" stroke-dasharray="4 3"><title>stage boundary at step {3:.0f}</title></line>)svg",
                         X(st.step), top, H - bottom, st.step);
    // Right of its line, or left of it where it would run off the chart; a white outline keeps
    // it readable where a curve passes under it.
    const double at = X(std::max(st.step, x0));
    const bool fits_right = at + 3 + text_width(st.label, 10) <= W;
    svg += fmt::format(R"svg(<text x="{:.1f}" y="{}" font-size="10" fill="#555" text-anchor="{}" stroke="white" stroke-width="3" paint-order="stroke">{}</text>)svg",
                       fits_right ? at + 3 : at - 3, top + 11, fits_right ? "start" : "end", html_escape(st.label));
  }
  if (std::isfinite(reference))
    svg += fmt::format(R"svg(<line x1="{0}" x2="{1}" y1="{2:.1f}" y2="{2:.1f}" stroke="#c33" stroke-dasharray="6 3"/><text x="{3}" y="{4:.1f}" fill="#c33" text-anchor="end">{5}</text>)svg",
                       left, W - right, Y(reference), W - right - 2, Y(reference) - 4, html_escape(reference_label));
  // The legend sits in the title row, right-aligned, clear of the plot and its stage labels.
  double legend_x = W - right;
  for (auto s = series.rbegin(); s != series.rend(); ++s) {
    legend_x -= 14 + text_width(s->name, font);
    svg += fmt::format(R"svg(<rect x="{:.1f}" y="9" width="10" height="10" fill="{}"/><text x="{:.1f}" y="18">{}</text>)svg",
                       legend_x, s->color, legend_x + 14, html_escape(s->name));
    legend_x -= 16;
  }
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

// The smallest 1, 2 or 5 × 10^k that cuts `span` into at most `intervals` pieces.
double round_step(double span, int intervals) {
  const double raw = span / intervals;
  const double decade = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * decade >= raw * (1 - 1e-9)) return m * decade;
  return 10 * decade;
}

// Multiples k · step for k in [first, last]; computed from k, not summed, so 3 · 5e-4 prints as 0.0015.
std::vector<double> multiples(double step, double first, double last) {
  std::vector<double> out;
  for (double k = first; k <= last; ++k) out.push_back(k == 0 ? 0.0 : k * step);
  return out;
}

}  // namespace

Axis value_axis(double lo, double hi) {
  if (!(hi > lo)) hi = lo + 1;
  Axis a;
  a.step = round_step(hi - lo, 5);
  // The tolerance keeps a value that is a multiple up to rounding (0.3 / 0.1) from adding a tick.
  const double first = std::floor(lo / a.step + 1e-6), last = std::ceil(hi / a.step - 1e-6);
  a.ticks = multiples(a.step, first, last);
  a.lo = a.ticks.front(), a.hi = a.ticks.back();
  return a;
}

Axis step_axis(double lo, double hi) {
  if (!(hi > lo)) hi = lo + 1;
  Axis a{lo, hi, round_step(hi - lo, 6), {}};
  a.ticks = multiples(a.step, std::ceil(lo / a.step - 1e-6), std::floor(hi / a.step + 1e-6));
  return a;
}

std::string tick_label(double value, double step) {
  const int decimals = std::max(0, -int(std::floor(std::log10(step) + 1e-9)));
  if (std::fabs(value) < step * 1e-6) return "0";  // not "0.0000", nor "-0.000" from rounding
  return fmt::format("{:.{}f}", value, decimals);
}

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
  std::vector<Stage> stages;
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
  html += "<h2>Loss</h2>" + chart("Loss (nats per token)", {train, val}, stages, unigram, "unigram entropy");
  html += "<h2>Learning rate</h2>" + chart("Learning rate", {lr}, stages);
  html += "<h2>Throughput</h2>" + chart("Tokens per second", {tps}, stages) + chart(mfu_title, {mfu}, stages);
  html += "<h2>Mixture of experts</h2>" + heat_map(rows);
  if (run.contains("train"))
    html += "<h2>Configuration</h2><pre>" + html_escape(run.dump(2)) + "</pre>";
  html += "</body></html>\n";
  const fs::path out = run_dir / "report.html";
  write_file_atomic(out, html);
  return out;
}

}  // namespace hyla
