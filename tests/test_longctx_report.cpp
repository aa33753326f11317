// The long-context report: every cell's accuracy with its Wilson interval and RULER's score, the
// tiers pooled per length and their retention from L to 8L (null when the shorter scores 0), spread
// cells without a depth, the costs and controls in JSON; lengths written as 1K/1M; and an HTML page
// that names every task, escapes the model's text, labels spread rows and runs no script.
#include <gtest/gtest.h>

#include <string>

#include "hyla/eval/interval.h"
#include "hyla/eval/longctx_eval.h"
#include "hyla/eval/longctx_report.h"

namespace hyla {
namespace {

using ojson = nlohmann::ordered_json;

LongCtxCell cell(const std::string& task, LongCtxTier tier, int64_t length, double depth, int64_t samples,
                 int64_t correct, double found) {
  LongCtxCell c;
  c.task = task;
  c.tier = tier;
  c.length = length;
  c.depth = depth;
  c.samples = samples;
  c.correct = correct;
  c.found = found;
  c.prompt_tokens = samples * (length - 40);
  return c;
}

// passkey (retrieval) at depths 0 and 0.5, vt_2x8 (synthesis, spread), at 1K and 8K.
LongCtxResult sample_result() {
  LongCtxResult r;
  r.seed = 7;
  r.model = "runs/tiny <model>";
  r.haystack = "data/haystack.txt";
  r.seconds = 12.5;
  const auto R = LongCtxTier::Retrieval, S = LongCtxTier::Synthesis;
  r.cells = {cell("passkey", R, 1024, 0.0, 10, 9, 9.5),    cell("passkey", R, 1024, 0.5, 10, 7, 8.0),
             cell("passkey", R, 8192, 0.0, 10, 6, 6.5),    cell("passkey", R, 8192, 0.5, 10, 4, 5.0),
             cell("vt_2x8", S, 1024, -1.0, 20, 0, 4.0),     cell("vt_2x8", S, 8192, -1.0, 20, 3, 9.0)};
  r.cells[0].examples = {{{"71432"}, "The pass key is 71432.", true}, {{"55120"}, "I do not know", false}};
  r.cells[4].examples = {{{"alpha", "beta"}, "<b>alpha</b> & gamma", false}};
  LongCtxLength short_length;
  short_length.length = 1024;
  short_length.samples = 40;
  short_length.prompt_tokens = 40 * 984;
  short_length.generated_tokens = 400;
  short_length.seconds = 4.0;
  short_length.sequences = 8;
  short_length.state_bytes_per_sequence = 3 << 20;
  short_length.peak_rss_bytes = int64_t(512) << 20;
  LongCtxLength long_length = short_length;
  long_length.length = 8192;
  long_length.prompt_tokens = 40 * 8152;
  long_length.seconds = 8.0;
  r.lengths = {short_length, long_length};
  r.no_context = {cell("passkey", R, 0, -1.0, 10, 0, 0.0), cell("vt_2x8", S, 0, -1.0, 20, 1, 2.0)};
  r.contamination_checked = true;
  r.contamination_samples = 80;
  r.contamination_found = 0;
  return r;
}

void expect_interval(const ojson& interval, int64_t correct, int64_t samples) {
  const Interval ci = wilson_interval(correct, samples);
  ASSERT_EQ(interval.size(), 2u);
  EXPECT_DOUBLE_EQ(interval[0].get<double>(), ci.low);
  EXPECT_DOUBLE_EQ(interval[1].get<double>(), ci.high);
}

TEST(LongCtxReport, FormatsLengths) {
  EXPECT_EQ(format_length(1024), "1K");
  EXPECT_EQ(format_length(4096), "4K");
  EXPECT_EQ(format_length(32768), "32K");
  EXPECT_EQ(format_length(131072), "128K");
  EXPECT_EQ(format_length(1048576), "1M");
  EXPECT_EQ(format_length(2 * 1048576), "2M");
  EXPECT_EQ(format_length(1048576 + 1024), "1025K");
  EXPECT_EQ(format_length(1500), "1500");
  EXPECT_EQ(format_length(0), "0");
}

TEST(LongCtxReport, JsonCellsCarryAccuracyIntervalAndRulerScore) {
  const ojson j = longctx_json(sample_result());
  EXPECT_EQ(j["generator"], kLongCtxGenerator);
  EXPECT_EQ(j["seed"].get<uint64_t>(), 7u);
  EXPECT_EQ(j["model"], "runs/tiny <model>");
  EXPECT_EQ(j["haystack"], "data/haystack.txt");
  EXPECT_DOUBLE_EQ(j["seconds"].get<double>(), 12.5);
  ASSERT_EQ(j["cells"].size(), 6u);

  const ojson& c = j["cells"][1];
  EXPECT_EQ(c["task"], "passkey");
  EXPECT_EQ(c["tier"], "retrieval");
  EXPECT_EQ(c["length"].get<int64_t>(), 1024);
  EXPECT_DOUBLE_EQ(c["depth"].get<double>(), 0.5);
  EXPECT_EQ(c["samples"].get<int64_t>(), 10);
  EXPECT_EQ(c["correct"].get<int64_t>(), 7);
  EXPECT_DOUBLE_EQ(c["accuracy"].get<double>(), 0.7);
  expect_interval(c["interval"], 7, 10);
  EXPECT_DOUBLE_EQ(c["ruler_score"].get<double>(), 0.8);
  EXPECT_DOUBLE_EQ(c["mean_prompt_tokens"].get<double>(), 984.0);
  EXPECT_DOUBLE_EQ(j["cells"][0]["depth"].get<double>(), 0.0);  // depth 0 is a depth, not spread

  const ojson& spread = j["cells"][4];
  EXPECT_EQ(spread["tier"], "synthesis");
  EXPECT_TRUE(spread["depth"].is_null());
  EXPECT_DOUBLE_EQ(spread["accuracy"].get<double>(), 0.0);
  expect_interval(spread["interval"], 0, 20);
  EXPECT_DOUBLE_EQ(spread["ruler_score"].get<double>(), 0.2);

  const ojson& examples = j["cells"][0]["examples"];
  ASSERT_EQ(examples.size(), 2u);
  EXPECT_EQ(examples[0]["expected"], ojson::array({"71432"}));
  EXPECT_EQ(examples[0]["output"], "The pass key is 71432.");
  EXPECT_EQ(examples[0]["correct"], true);
  EXPECT_EQ(examples[1]["correct"], false);
  EXPECT_EQ(j["cells"][4]["examples"][0]["expected"], ojson::array({"alpha", "beta"}));
}

TEST(LongCtxReport, JsonPoolsTiersAndRetention) {
  const ojson j = longctx_json(sample_result());
  const ojson& tiers = j["tiers"];
  ASSERT_EQ(tiers.size(), 2u);

  const ojson& retrieval = tiers[0];
  EXPECT_EQ(retrieval["tier"], "retrieval");
  ASSERT_EQ(retrieval["lengths"].size(), 2u);
  const ojson& r1 = retrieval["lengths"][0];
  EXPECT_EQ(r1["length"].get<int64_t>(), 1024);
  EXPECT_EQ(r1["samples"].get<int64_t>(), 20);
  EXPECT_EQ(r1["correct"].get<int64_t>(), 16);  // 9 + 7 over both depths
  EXPECT_DOUBLE_EQ(r1["accuracy"].get<double>(), 0.8);
  expect_interval(r1["interval"], 16, 20);
  const ojson& r8 = retrieval["lengths"][1];
  EXPECT_EQ(r8["length"].get<int64_t>(), 8192);
  EXPECT_EQ(r8["correct"].get<int64_t>(), 10);
  EXPECT_DOUBLE_EQ(r8["accuracy"].get<double>(), 0.5);
  ASSERT_EQ(retrieval["retention"].size(), 1u);
  EXPECT_EQ(retrieval["retention"][0]["length"].get<int64_t>(), 1024);
  EXPECT_EQ(retrieval["retention"][0]["long_length"].get<int64_t>(), 8192);
  EXPECT_DOUBLE_EQ(retrieval["retention"][0]["ratio"].get<double>(), 0.5 / 0.8);

  const ojson& synthesis = tiers[1];
  EXPECT_EQ(synthesis["tier"], "synthesis");
  ASSERT_EQ(synthesis["lengths"].size(), 2u);
  EXPECT_DOUBLE_EQ(synthesis["lengths"][0]["accuracy"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(synthesis["lengths"][1]["accuracy"].get<double>(), 0.15);
  ASSERT_EQ(synthesis["retention"].size(), 1u);
  EXPECT_TRUE(synthesis["retention"][0]["ratio"].is_null());  // 0 at 1K: no ratio
}

TEST(LongCtxReport, RetentionNeedsEightTimesTheLength) {
  LongCtxResult r = sample_result();
  for (LongCtxCell& c : r.cells)
    if (c.length == 8192) c.length = 4096;
  const ojson j = longctx_json(r);
  EXPECT_EQ(j["tiers"][0]["lengths"].size(), 2u);
  EXPECT_TRUE(j["tiers"][0]["retention"].empty());
  EXPECT_TRUE(j["tiers"][1]["retention"].empty());
}

TEST(LongCtxReport, JsonLengthsAndControls) {
  const ojson j = longctx_json(sample_result());
  ASSERT_EQ(j["lengths"].size(), 2u);
  const ojson& l = j["lengths"][1];
  EXPECT_EQ(l["length"].get<int64_t>(), 8192);
  EXPECT_DOUBLE_EQ(l["seconds"].get<double>(), 8.0);
  EXPECT_EQ(l["samples"].get<int64_t>(), 40);
  EXPECT_EQ(l["prompt_tokens"].get<int64_t>(), 40 * 8152);
  EXPECT_EQ(l["generated_tokens"].get<int64_t>(), 400);
  EXPECT_DOUBLE_EQ(l["prompt_tokens_per_s"].get<double>(), 40.0 * 8152 / 8.0);
  EXPECT_EQ(l["sequences"].get<int64_t>(), 8);
  EXPECT_EQ(l["state_bytes_per_sequence"].get<int64_t>(), 3 << 20);
  EXPECT_EQ(l["peak_rss_bytes"].get<int64_t>(), int64_t(512) << 20);

  const ojson& no_context = j["controls"]["no_context"];
  ASSERT_EQ(no_context.size(), 2u);
  EXPECT_EQ(no_context[1]["task"], "vt_2x8");
  EXPECT_EQ(no_context[1]["samples"].get<int64_t>(), 20);
  EXPECT_EQ(no_context[1]["correct"].get<int64_t>(), 1);
  EXPECT_DOUBLE_EQ(no_context[1]["accuracy"].get<double>(), 0.05);
  expect_interval(no_context[1]["interval"], 1, 20);

  const ojson& contamination = j["controls"]["contamination"];
  EXPECT_EQ(contamination["checked"], true);
  EXPECT_EQ(contamination["samples"].get<int64_t>(), 80);
  EXPECT_EQ(contamination["found"].get<int64_t>(), 0);
  EXPECT_TRUE(contamination["examples"].empty());
}

TEST(LongCtxReport, HtmlNamesTasksEscapesTextAndRunsNoScript) {
  LongCtxResult r = sample_result();
  const std::string html = longctx_html(r);
  EXPECT_NE(html.find("<!doctype html>"), std::string::npos);
  EXPECT_NE(html.find("passkey"), std::string::npos);
  EXPECT_NE(html.find("vt_2x8"), std::string::npos);
  EXPECT_NE(html.find(kLongCtxGenerator), std::string::npos);
  EXPECT_NE(html.find("&lt;b&gt;alpha&lt;/b&gt; &amp; gamma"), std::string::npos);
  EXPECT_EQ(html.find("<b>alpha"), std::string::npos);
  EXPECT_NE(html.find("runs/tiny &lt;model&gt;"), std::string::npos);
  EXPECT_NE(html.find("spread"), std::string::npos);
  EXPECT_NE(html.find("<th>1K</th>"), std::string::npos);
  EXPECT_NE(html.find("<th>8K</th>"), std::string::npos);
  EXPECT_NE(html.find("80.0% <span class=ci>"), std::string::npos);  // retrieval pooled at 1K
  EXPECT_NE(html.find("n=20"), std::string::npos);
  EXPECT_NE(html.find("0.625"), std::string::npos);  // retrieval's retention 1K → 8K
  EXPECT_NE(html.find("no inserted sentence occurs in 80 samples checked"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("http"), std::string::npos);  // nothing external

  r.contamination_checked = false;
  EXPECT_NE(longctx_html(r).find("not checked"), std::string::npos);
  r.contamination_checked = true;
  r.contamination_found = 2;
  r.contamination_examples = {"The <secret> key is 1."};
  const std::string found = longctx_html(r);
  EXPECT_NE(found.find("2 of 80 samples"), std::string::npos);
  EXPECT_NE(found.find("The &lt;secret&gt; key is 1."), std::string::npos);
}

}  // namespace
}  // namespace hyla
