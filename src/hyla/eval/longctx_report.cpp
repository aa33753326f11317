#include "hyla/eval/longctx_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <vector>

#include "hyla/core/text.h"
#include "hyla/eval/interval.h"
#include "hyla/io/svg.h"

namespace hyla {

using ojson = nlohmann::ordered_json;

namespace {

constexpr double kMiB = 1048576.0;

struct Counts {
  int64_t samples = 0, correct = 0;
  double accuracy() const { return samples ? double(correct) / double(samples) : 0.0; }
  void add(const LongCtxCell& cell) {
    samples += cell.samples;
    correct += cell.correct;
  }
};

// A tier's cells pooled per length (ascending).
struct TierScores {
  LongCtxTier tier = LongCtxTier::Retrieval;
  std::map<int64_t, Counts> lengths;
};

// Each tier that has cells, in enum order.
std::vector<TierScores> pool_tiers(const std::vector<LongCtxCell>& cells) {
  std::map<LongCtxTier, std::map<int64_t, Counts>> pooled;
  for (const LongCtxCell& cell : cells) pooled[cell.tier][cell.length].add(cell);
  std::vector<TierScores> tiers;
  for (auto& [tier, lengths] : pooled) tiers.push_back({tier, std::move(lengths)});
  return tiers;
}

// score(8L) / score(L) for each length L whose 8L was measured; empty where score(L) is 0.
struct Retention {
  int64_t length = 0, long_length = 0;
  std::optional<double> ratio;
};

std::vector<Retention> retention(const std::map<int64_t, Counts>& lengths) {
  std::vector<Retention> out;
  for (const auto& [length, counts] : lengths) {
    if (length <= 0 || length > std::numeric_limits<int64_t>::max() / 8) continue;
    const auto longer = lengths.find(8 * length);
    if (longer == lengths.end()) continue;
    Retention r{length, 8 * length, std::nullopt};
    if (counts.accuracy() > 0) r.ratio = longer->second.accuracy() / counts.accuracy();
    out.push_back(r);
  }
  return out;
}

// The tasks in the order their first cell appears.
std::vector<std::string> task_order(const std::vector<LongCtxCell>& cells) {
  std::vector<std::string> tasks;
  for (const LongCtxCell& cell : cells)
    if (std::find(tasks.begin(), tasks.end(), cell.task) == tasks.end()) tasks.push_back(cell.task);
  return tasks;
}

ojson interval_json(int64_t correct, int64_t samples) {
  const Interval ci = wilson_interval(correct, samples);
  return ojson::array({ci.low, ci.high});
}

ojson accuracy_json(int64_t correct, int64_t samples) {
  return {{"samples", samples},
          {"correct", correct},
          {"accuracy", samples ? double(correct) / double(samples) : 0.0},
          {"interval", interval_json(correct, samples)}};
}

// "87.0% [80.1, 91.8] n=300" (the interval greyed).
std::string percent(int64_t correct, int64_t samples) {
  const Interval ci = wilson_interval(correct, samples);
  return fmt::format("{:.1f}% <span class=ci>[{:.1f}, {:.1f}]</span> n={}",
                     samples ? 100.0 * double(correct) / double(samples) : 0.0, 100 * ci.low, 100 * ci.high, samples);
}

std::string depth_label(double depth) { return depth < 0 ? "spread" : fmt::format("{:g}%", 100 * depth); }

// Red at 0, yellow at 0.5, green at 1.
constexpr Rgb kAccuracyScale[] = {{230, 124, 115}, {255, 214, 102}, {87, 187, 138}};

std::string join_escaped(const std::vector<std::string>& texts) {
  std::string out;
  for (const std::string& t : texts) out += (out.empty() ? "" : ", ") + html_escape(t);
  return out;
}

// A task's depth × length heat map: rows depths ("spread" for depth < 0), columns lengths.
std::string heat_map(const std::string& task, const std::vector<LongCtxCell>& cells) {
  std::map<double, std::map<int64_t, Counts>> grid;
  std::vector<int64_t> lengths;
  for (const LongCtxCell& cell : cells) {
    if (cell.task != task) continue;
    grid[cell.depth < 0 ? -1.0 : cell.depth][cell.length].add(cell);
    if (std::find(lengths.begin(), lengths.end(), cell.length) == lengths.end()) lengths.push_back(cell.length);
  }
  std::sort(lengths.begin(), lengths.end());
  std::string html = "<table class=heat><tr><th>depth</th>";
  for (const int64_t length : lengths) html += fmt::format("<th>{}</th>", format_length(length));
  html += "</tr>";
  for (const auto& [depth, row] : grid) {
    html += fmt::format("<tr><th>{}</th>", depth_label(depth));
    for (const int64_t length : lengths) {
      const auto it = row.find(length);
      if (it == row.end() || it->second.samples == 0) {
        html += "<td class=none></td>";
        continue;
      }
      const Counts& c = it->second;
      const Interval ci = wilson_interval(c.correct, c.samples);
      html += fmt::format(R"~(<td style="background:{}" title="Wilson 95%: [{:.1f}%, {:.1f}%]">{:.1f}%<br><span class=n>n={}</span></td>)~",
                          scale_colour(kAccuracyScale, c.accuracy()), 100 * ci.low, 100 * ci.high, 100 * c.accuracy(), c.samples);
    }
    html += "</tr>";
  }
  return html + "</table>";
}

}  // namespace

std::string format_length(int64_t tokens) {
  if (tokens > 0 && tokens % 1048576 == 0) return fmt::format("{}M", tokens / 1048576);
  if (tokens > 0 && tokens % 1024 == 0) return fmt::format("{}K", tokens / 1024);
  return fmt::format("{}", tokens);
}

ojson longctx_json(const LongCtxResult& result) {
  ojson out = {{"generator", result.generator},
               {"seed", result.seed},
               {"wording", to_string(result.wording)},
               {"model", result.model},
               {"haystack", result.haystack},
               {"seconds", result.seconds}};

  ojson cells = ojson::array();
  for (const LongCtxCell& cell : result.cells) {
    ojson examples = ojson::array();
    for (const LongCtxExample& e : cell.examples)
      examples.push_back({{"expected", e.expected}, {"output", e.output}, {"correct", e.correct}});
    const double n = double(cell.samples);
    cells.push_back({{"task", cell.task},
                     {"tier", to_string(cell.tier)},
                     {"length", cell.length},
                     {"depth", cell.depth < 0 ? ojson(nullptr) : ojson(cell.depth)},
                     {"samples", cell.samples},
                     {"correct", cell.correct},
                     {"accuracy", cell.accuracy()},
                     {"interval", interval_json(cell.correct, cell.samples)},
                     {"ruler_score", cell.samples ? cell.found / n : 0.0},
                     {"mean_prompt_tokens", cell.samples ? double(cell.prompt_tokens) / n : 0.0},
                     {"examples", examples}});
  }
  out["cells"] = cells;
  ojson skipped = ojson::array();
  for (const LongCtxResult::Skipped& s : result.skipped)
    skipped.push_back({{"task", s.task}, {"length", s.length}, {"reason", s.reason}});
  out["skipped"] = skipped;

  ojson tiers = ojson::array();
  for (const TierScores& tier : pool_tiers(result.cells)) {
    ojson lengths = ojson::array();
    for (const auto& [length, counts] : tier.lengths) {
      ojson j = {{"length", length}};
      j.update(accuracy_json(counts.correct, counts.samples));
      lengths.push_back(j);
    }
    ojson kept = ojson::array();
    for (const Retention& r : retention(tier.lengths))
      kept.push_back({{"length", r.length}, {"long_length", r.long_length},
                      {"ratio", r.ratio ? ojson(*r.ratio) : ojson(nullptr)}});
    tiers.push_back({{"tier", to_string(tier.tier)}, {"lengths", lengths}, {"retention", kept}});
  }
  out["tiers"] = tiers;

  ojson lengths = ojson::array();
  for (const LongCtxLength& l : result.lengths)
    lengths.push_back({{"length", l.length},
                       {"seconds", l.seconds},
                       {"samples", l.samples},
                       {"prompt_tokens", l.prompt_tokens},
                       {"generated_tokens", l.generated_tokens},
                       {"prompt_tokens_per_s", l.seconds > 0 ? double(l.prompt_tokens) / l.seconds : 0.0},
                       {"sequences", l.sequences},
                       {"state_bytes_per_sequence", l.state_bytes_per_sequence},
                       {"peak_rss_bytes", l.peak_rss_bytes}});
  out["lengths"] = lengths;

  ojson no_context = ojson::array();
  for (const LongCtxCell& cell : result.no_context) {
    ojson j = {{"task", cell.task}};
    j.update(accuracy_json(cell.correct, cell.samples));
    no_context.push_back(j);
  }
  out["controls"] = {{"no_context", no_context},
                     {"contamination",
                      {{"checked", result.contamination_checked},
                       {"samples", result.contamination_samples},
                       {"found", result.contamination_found},
                       {"examples", result.contamination_examples}}}};
  return out;
}

std::string longctx_html(const LongCtxResult& result) {
  std::string html = R"~(<!doctype html><html><head><meta charset="utf-8"><title>hyla eval longctx</title><style>
body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:8px 0}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}.ci,.n{color:#777;font-size:90%}
.heat td{text-align:center;min-width:64px}.heat .n{color:#444}.heat td.none{background:#eee}
.num{text-align:right}.ok{color:#080}.bad{color:#b00}.maps{display:flex;flex-wrap:wrap;gap:8px 32px}
.maps h3{margin:12px 0 0}
</style></head><body>)~";
  html += fmt::format(
      "<h1>hyla eval longctx</h1><p>generator <code>{}</code>, seed {}, wording {}, model <code>{}</code>, haystack "
      "<code>{}</code>, {:.1f} s</p><p>A sample is right when every expected string is in the answer (case ignored); intervals are "
      "Wilson 95%.</p>",
      html_escape(result.generator), result.seed, to_string(result.wording), html_escape(result.model),
      html_escape(result.haystack),
      result.seconds);

  // Retrieval vs synthesis: each tier pooled per length, and what it keeps from L to 8L.
  const std::vector<TierScores> tiers = pool_tiers(result.cells);
  std::vector<int64_t> all_lengths;
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (const TierScores& tier : tiers) {
    for (const auto& [length, counts] : tier.lengths)
      if (std::find(all_lengths.begin(), all_lengths.end(), length) == all_lengths.end()) all_lengths.push_back(length);
    for (const Retention& r : retention(tier.lengths))
      if (std::find(pairs.begin(), pairs.end(), std::pair{r.length, r.long_length}) == pairs.end())
        pairs.emplace_back(r.length, r.long_length);
  }
  std::sort(all_lengths.begin(), all_lengths.end());
  std::sort(pairs.begin(), pairs.end());
  html += "<h2>Retrieval vs synthesis</h2><table><tr><th>tier</th>";
  for (const int64_t length : all_lengths) html += fmt::format("<th>{}</th>", format_length(length));
  html += "</tr>";
  for (const TierScores& tier : tiers) {
    html += fmt::format("<tr><td>{}</td>", html_escape(to_string(tier.tier)));
    for (const int64_t length : all_lengths) {
      const auto it = tier.lengths.find(length);
      html += it == tier.lengths.end() ? "<td></td>"
                                       : fmt::format("<td>{}</td>", percent(it->second.correct, it->second.samples));
    }
    html += "</tr>";
  }
  html += "</table>";
  if (!pairs.empty()) {
    html += "<h3>Retention: score(8L) / score(L)</h3><table><tr><th>tier</th>";
    for (const auto& [length, long_length] : pairs)
      html += fmt::format("<th>{} &rarr; {}</th>", format_length(length), format_length(long_length));
    html += "</tr>";
    for (const TierScores& tier : tiers) {
      const std::vector<Retention> kept = retention(tier.lengths);
      html += fmt::format("<tr><td>{}</td>", html_escape(to_string(tier.tier)));
      for (const auto& [length, long_length] : pairs) {
        const auto it = std::find_if(kept.begin(), kept.end(), [&](const Retention& r) { return r.length == length; });
        if (it == kept.end()) html += "<td></td>";
        else if (!it->ratio) html += "<td class=num title=\"score(L) is 0\">n/a</td>";
        else html += fmt::format("<td class=num>{:.3f}</td>", *it->ratio);
      }
      html += "</tr>";
    }
    html += "</table>";
  }

  const std::vector<std::string> tasks = task_order(result.cells);
  html += "<h2>Accuracy by length and depth</h2><div class=maps>";
  for (const std::string& task : tasks) {
    const auto first = std::find_if(result.cells.begin(), result.cells.end(),
                                     [&](const LongCtxCell& c) { return c.task == task; });
    html += fmt::format("<div><h3>{} <span class=ci>({})</span></h3>{}</div>", html_escape(task),
                        html_escape(to_string(first->tier)), heat_map(task, result.cells));
  }
  html += "</div>";

  html += "<h2>Cost by length</h2><table><tr><th>length</th><th>samples</th><th>seconds</th><th>prompt tok/s</th>"
          "<th>sequences</th><th>state MiB / sequence</th><th>peak RSS MiB</th></tr>";
  for (const LongCtxLength& l : result.lengths)
    html += fmt::format(
        "<tr><td>{}</td><td class=num>{}</td><td class=num>{:.1f}</td><td class=num>{:.0f}</td><td class=num>{}</td>"
        "<td class=num>{:.2f}</td><td class=num>{:.1f}</td></tr>",
        format_length(l.length), l.samples, l.seconds, l.seconds > 0 ? double(l.prompt_tokens) / l.seconds : 0.0,
        l.sequences, double(l.state_bytes_per_sequence) / kMiB, double(l.peak_rss_bytes) / kMiB);
  html += "</table>";
  if (!result.skipped.empty()) {
    html += "<p>Not run where the length cannot hold the task:</p><ul>";
    for (const LongCtxResult::Skipped& s : result.skipped)
      html += fmt::format("<li>{} at {}: {}</li>", html_escape(s.task), format_length(s.length), html_escape(s.reason));
    html += "</ul>";
  }

  html += "<h2>Controls</h2><h3>No context (must score at chance)</h3>";
  if (result.no_context.empty()) {
    html += "<p>not run</p>";
  } else {
    html += "<table><tr><th>task</th><th>accuracy</th></tr>";
    for (const LongCtxCell& cell : result.no_context)
      html += fmt::format("<tr><td>{}</td><td>{}</td></tr>", html_escape(cell.task), percent(cell.correct, cell.samples));
    html += "</table>";
  }
  html += "<h3>Contamination</h3><p>";
  if (!result.contamination_checked) {
    html += "not checked";
  } else if (result.contamination_found == 0) {
    html += fmt::format("no inserted sentence occurs in {} samples checked", result.contamination_samples);
  } else {
    html += fmt::format("<span class=bad>{} of {} samples checked have an inserted sentence in the training text</span>",
                        result.contamination_found, result.contamination_samples);
    if (!result.contamination_examples.empty()) {
      html += "</p><ul>";
      for (const std::string& e : result.contamination_examples) html += fmt::format("<li>{}</li>", html_escape(e));
      html += "</ul><p>";
    }
  }
  html += "</p>";

  html += "<h2>Examples</h2>";
  for (const std::string& task : tasks) {
    const LongCtxCell& cell =
        *std::find_if(result.cells.begin(), result.cells.end(), [&](const LongCtxCell& c) { return c.task == task; });
    html += fmt::format("<h3>{}: {}, depth {}</h3>", html_escape(task), format_length(cell.length), depth_label(cell.depth));
    if (cell.examples.empty()) {
      html += "<p>none kept</p>";
      continue;
    }
    html += "<table><tr><th>expected</th><th>output</th></tr>";
    for (const LongCtxExample& e : cell.examples)
      html += fmt::format("<tr><td>{}</td><td class={}>{}</td></tr>", join_escaped(e.expected), e.correct ? "ok" : "bad",
                          html_escape(e.output.empty() ? "(nothing)" : e.output));
    html += "</table>";
  }
  return html + "</body></html>\n";
}

}  // namespace hyla
