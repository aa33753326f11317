#include "hyla/eval/image_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "hyla/core/text.h"
#include "hyla/data/image_file.h"
#include "hyla/eval/interval.h"
#include "hyla/io/base64.h"
#include "hyla/io/svg.h"

namespace hyla {

using ojson = nlohmann::ordered_json;

namespace {

std::string label_name(const std::vector<std::string>& names, int32_t label) {
  return label >= 0 && size_t(label) < names.size() ? names[size_t(label)] : fmt::format("label {}", label);
}

ojson accuracy(int64_t correct, int64_t samples) {
  const Interval ci = wilson_interval(correct, samples);
  return {{"accuracy", samples ? double(correct) / double(samples) : 0.0},
          {"ci95", {ci.low, ci.high}},
          {"correct", correct},
          {"samples", samples}};
}

// Each label's one answer, when every record of a label has the same answer (classification).
std::map<int32_t, std::string> class_answers(const ImageEvalResult& r) {
  std::map<int32_t, std::string> answers;
  for (const ImageAnswer& a : r.answers) {
    if (a.label < 0) return {};
    const auto [it, added] = answers.emplace(a.label, a.expected);
    if (!added && it->second != a.expected) return {};
  }
  return answers;
}

std::string percent(const ojson& a) {
  return fmt::format("{:.1f}% <span class=ci>[{:.1f}, {:.1f}]</span> of {}", 100 * a["accuracy"].get<double>(),
                     100 * a["ci95"][0].get<double>(), 100 * a["ci95"][1].get<double>(), a["samples"].get<int64_t>());
}

// The confusion matrix as a heat map: rows are true labels, columns predicted (+ "other"),
// shaded by their share of the row.
std::string confusion_svg(const ojson& confusion, const std::vector<std::string>& names) {
  HeatMap map{.rows = names, .columns = names, .scale = {{255, 255, 255}, {55, 115, 215}}};
  map.columns.push_back("other");
  for (const auto& row : confusion) {
    int64_t total = 0;
    for (const auto& v : row) total += v.get<int64_t>();
    auto& cells = map.cells.emplace_back();
    for (const auto& v : row) {
      const int64_t n = v.get<int64_t>();
      cells.push_back(HeatCell{total ? double(n) / double(total) : 0, n ? std::to_string(n) : "", ""});
    }
  }
  return heat_map_svg(map);
}

}  // namespace

ojson summarize_image_eval(const std::vector<ImageEvalRun>& runs, const std::vector<std::string>& label_names) {
  ojson out = ojson::object();
  for (const ImageEvalRun& run : runs) {
    const ImageEvalResult& r = run.result;
    ojson j = accuracy(r.correct(), int64_t(r.answers.size()));
    j["seconds"] = r.seconds;
    j["images_per_s"] = r.seconds > 0 ? double(r.answers.size()) / r.seconds : 0.0;
    j["image_positions"] = r.image_positions;
    j["prompt_tokens"] = r.prompt_tokens;
    j["generated_tokens"] = r.generated_tokens;
    std::map<int32_t, std::pair<int64_t, int64_t>> by_label;
    for (const ImageAnswer& a : r.answers) {
      auto& [correct, samples] = by_label[a.label];
      correct += a.correct;
      ++samples;
    }
    ojson labels = ojson::object();
    for (const auto& [label, counts] : by_label) labels[label_name(label_names, label)] = accuracy(counts.first, counts.second);
    j["by_label"] = labels;
    const std::map<int32_t, std::string> classes = class_answers(r);
    if (!classes.empty() && classes.rbegin()->first < 4096) {
      const size_t k = size_t(classes.rbegin()->first) + 1;
      std::vector<std::vector<int64_t>> confusion(k, std::vector<int64_t>(k + 1, 0));
      for (const ImageAnswer& a : r.answers) {
        size_t predicted = k;  // "other": no class's answer
        for (const auto& [label, answer] : classes)
          if (a.output == answer) predicted = size_t(label);
        ++confusion[size_t(a.label)][predicted];
      }
      j["confusion"] = confusion;
    }
    out[to_string(run.control)] = j;
  }
  return out;
}

std::string image_eval_html(const ojson& summary, const std::vector<ImageEvalRun>& runs) {
  std::vector<std::string> names;
  if (summary.contains("label_names"))
    for (const auto& n : summary["label_names"]) names.push_back(n.get<std::string>());
  const ojson& results = summary.at("runs");
  std::string html = R"~(<!doctype html><html><head><meta charset="utf-8"><title>hyla eval images</title><style>
body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:8px 0}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}.ci{color:#777;font-size:90%}
.ex{display:inline-block;margin:4px;text-align:center;font-size:11px;width:120px;vertical-align:top}
.ex img{image-rendering:pixelated;width:84px;border:1px solid #999}.ok{color:#080}.bad{color:#b00}
</style></head><body>)~";
  html += fmt::format("<h1>hyla eval images</h1><p>model <code>{}</code>, records <code>{}</code> ({} split)</p>",
                      html_escape(summary.value("model", "")), html_escape(summary.value("images", "")),
                      html_escape(summary.value("split", "")));
  html += "<h2>Accuracy (exact match, Wilson 95% interval)</h2><table><tr><th>run</th><th>accuracy</th><th>images/s</th></tr>";
  for (const auto& [name, r] : results.items())
    html += fmt::format("<tr><td>{}</td><td>{}</td><td>{:.1f}</td></tr>", name, percent(r), r["images_per_s"].get<double>());
  html += "</table>";
  html += "<h2>By label</h2><table><tr><th>label</th>";
  for (const auto& [name, r] : results.items()) html += fmt::format("<th>{}</th>", name);
  html += "</tr>";
  if (!results.empty())
    for (const auto& [label, unused] : results.begin().value()["by_label"].items()) {
      html += fmt::format("<tr><td>{}</td>", html_escape(label));
      for (const auto& [name, r] : results.items())
        html += r["by_label"].contains(label) ? fmt::format("<td>{}</td>", percent(r["by_label"][label])) : "<td></td>";
      html += "</tr>";
    }
  html += "</table>";
  if (summary.contains("text")) {
    const ojson& t = summary["text"];
    html += fmt::format("<h2>Text: still a language model?</h2><p>validation loss on <code>{}</code>: this model {:.4f}",
                        html_escape(t.value("data", "")), t.value("model_loss", NAN));
    if (t.contains("twin_loss"))
      html += fmt::format(", the text-only twin <code>{}</code> {:.4f} (ratio {:.4f})", html_escape(t.value("twin", "")),
                          t.value("twin_loss", NAN), t.value("ratio", NAN));
    html += "</p>";
  }
  for (const auto& [name, r] : results.items())
    if (r.contains("confusion") && !names.empty() && r["confusion"].size() <= names.size()) {
      std::vector<std::string> shown(names.begin(), names.begin() + int64_t(r["confusion"].size()));
      html += fmt::format("<h2>Confusion matrix: {} (rows true, columns predicted)</h2>{}", name,
                          confusion_svg(r["confusion"], shown));
    }
  for (const ImageEvalRun& run : runs) {
    html += fmt::format("<h2>Examples: {}</h2><div>", to_string(run.control));
    for (size_t i = 0; i < run.result.examples.size() && i < run.result.answers.size(); ++i) {
      const ImageAnswer& a = run.result.answers[i];
      html += fmt::format(R"~(<div class=ex><img src="data:image/png;base64,{}"><br>expected: {}<br><span class={}>model: {}</span></div>)~",
                          base64_encode(encode_png(run.result.examples[i])), html_escape(a.expected), a.correct ? "ok" : "bad",
                          html_escape(a.output.empty() ? "(nothing)" : a.output));
    }
    html += "</div>";
  }
  return html + "</body></html>\n";
}

}  // namespace hyla
