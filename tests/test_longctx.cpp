// The long-context suite: every task's samples are deterministic, fill their length without
// exceeding it, round-trip through the tokenizer, put the needle at its depth, and carry answers
// that an independent solver reads back from the prompt's text (so a model that reads perfectly
// scores 100%); the no-context control keeps the question and drops every fact; scoring is
// RULER's; the local and the served paths give the same answers; the CLI's errors name the problem.
// Training on the same generators (TRAIN.json "longctx"): the answer alone is scored, tasks that
// do not fit a stage are left out, and a resumed run draws the same samples.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include "hyla/core/error.h"
#include "hyla/core/random.h"
#include "hyla/eval/longctx_eval.h"
#include "hyla/eval/longctx_report.h"
#include "hyla/eval/longctx_tasks.h"
#include "hyla/io/json_fields.h"
#include "hyla/serve/server.h"
#include "hyla/train/longctx_mix.h"
#include "hyla/train/row_source.h"
#include "hyla/train/train_config.h"
#include "model_test_util.h"
#include "test_util.h"
#include "text_fixtures.h"
#include "tiny_run.h"

namespace hyla {
namespace {

// Sentences of 300 made-up words, one a line as the KJV file is (the sample text has too few words).
const std::string& haystack_text() {
  static const std::string text = [] {
    std::vector<std::string> words;
    for (const char* c : {"b", "d", "k", "l", "m", "n", "p", "r", "s", "t"})
      for (const char* v : {"a", "e", "i", "o", "u"})
        for (const char* e : {"l", "n", "r", "s", "t", "m"}) words.push_back(std::string(c) + v + e);
    Rng rng(9);
    std::string lines;
    for (int sentence = 0; sentence < 400; ++sentence) {
      const uint64_t n = 5 + rng.below(10);
      for (uint64_t w = 0; w < n; ++w) {
        std::string word = words[rng.below(words.size())];
        if (w == 0) word[0] = char(std::toupper(word[0]));
        lines += word + (w + 1 < n ? " " : ".\n");
      }
    }
    return lines;
  }();
  return text;
}

const Haystack& haystack() {
  static const Haystack h(haystack_text(), test::small_tokenizer());
  return h;
}

LongCtxSample sample(const std::string& task, int64_t length, double depth = 0.5, uint64_t index = 0,
                     bool no_context = false, LongCtxWording wording = LongCtxWording::Ruler) {
  return make_longctx_sample(longctx_task(task), haystack(), test::small_tokenizer(), length, depth, 3, index, no_context,
                             wording);
}

std::string text_of(const LongCtxSample& s) { return test::small_tokenizer().decode(s.prompt); }

// ---- an independent reader of each task's prompt -------------------------------------------------

std::vector<std::string> all_matches(const std::string& text, const std::string& pattern, int group = 1) {
  std::vector<std::string> out;
  const std::regex re(pattern);
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back((*it)[group].str());
  return out;
}

std::string question_of(const std::string& text) { return text.substr(text.rfind('\n') + 1); }

// The k most frequent of `words`, as a set (ties would make the answer ambiguous: checked).
std::set<std::string> most_frequent(const std::vector<std::string>& words, size_t k) {
  std::map<std::string, int> count;
  for (const std::string& w : words) ++count[w];
  std::vector<std::pair<int, std::string>> by_count;
  for (const auto& [w, c] : count) by_count.emplace_back(-c, w);
  std::sort(by_count.begin(), by_count.end());
  EXPECT_GT(by_count.size(), k);
  if (by_count.size() > k) {
    EXPECT_LT(by_count[k - 1].first, by_count[k].first) << "the top " << k << " are tied";
  }
  std::set<std::string> top;
  for (size_t i = 0; i < k && i < by_count.size(); ++i) top.insert(by_count[i].second);
  return top;
}

// bAbI: replays the story's facts and answers its question.
std::string solve_story(const std::string& text) {
  std::map<std::string, std::string> person_at, holder, object_at;
  std::map<std::string, std::vector<std::string>> path;
  auto place = [&](const std::string& object, const std::string& where) {
    object_at[object] = where;
    if (path[object].empty() || path[object].back() != where) path[object].push_back(where);
  };
  const std::regex fact(R"((Mary|John|Daniel|Sandra|Fred|Julie|Bill|Emily) (went to|moved to|journeyed to|travelled to|picked up|got|grabbed|dropped|discarded|put down) the (\w+)\.)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), fact); it != std::sregex_iterator(); ++it) {
    const std::string who = (*it)[1], verb = (*it)[2], what = (*it)[3];
    if (verb.find(" to") != std::string::npos) {
      person_at[who] = what;
      for (const auto& [object, h] : holder)
        if (h == who) place(object, what);
    } else if (verb == "picked up" || verb == "got" || verb == "grabbed") {
      holder[what] = who;
      place(what, person_at.at(who));
    } else {
      holder.erase(what);
    }
  }
  std::smatch m;
  const std::string q = question_of(text);
  if (std::regex_search(q, m, std::regex(R"(Where is the (\w+)\?)"))) return object_at.at(m[1]);
  if (std::regex_search(q, m, std::regex(R"(Where is (\w+)\?)"))) return person_at.at(m[1]);
  if (std::regex_search(q, m, std::regex(R"(Where was the (\w+) before the (\w+)\?)"))) {
    const auto& p = path.at(m[1]);
    const auto at = std::find(p.begin(), p.end(), m[2].str());
    EXPECT_TRUE(at != p.end() && at != p.begin());
    return at != p.end() && at != p.begin() ? *(at - 1) : "";
  }
  ADD_FAILURE() << "no question in: " << q;
  return "";
}

// What a perfect reader answers, from the prompt's text alone.
std::set<std::string> solve(const std::string& task, const std::string& text) {
  const std::string q = question_of(text);
  if (task == "passkey") return {all_matches(text, R"((?:The pass key|The secret code) is (\d+)\. (?:Remember|Keep))").at(0)};
  if (task.rfind("niah", 0) == 0) {
    std::map<std::string, std::vector<std::string>> values;
    const std::regex needle(
        R"((?:One of the special magic (?:numbers|uuids) for|A hidden (?:number|uuid) that goes with) ([\w-]+) is:? ([0-9a-f-]+)\.)");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), needle); it != std::sregex_iterator(); ++it)
      values[(*it)[1]].push_back((*it)[2]);
    // The asked keys: "for KEY mentioned", "with KEY in the text", or "for K1, K2, K3, and K4 mentioned".
    std::string asked = all_matches(q, R"((?:for|with) (.+?) (?:mentioned|in the text))").at(0);
    if (const size_t last = asked.find(", and "); last != std::string::npos) asked.replace(last, 6, ", ");
    std::set<std::string> out;
    for (const std::string& key : all_matches(asked, R"(([^, ]+))")) out.insert(values[key].begin(), values[key].end());
    return out;
  }
  if (task.rfind("vt_", 0) == 0) {
    std::map<std::string, std::string> value;  // variable -> number, following the chain as it is read
    const std::regex statement(R"(VAR ([A-Z]{5}) = (VAR ([A-Z]{5})|(\d+))\.)");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), statement); it != std::sregex_iterator(); ++it)
      value[(*it)[1]] = (*it)[4].matched ? (*it)[4].str() : value.at((*it)[3]);
    const std::string asked = all_matches(q, R"((?:assigned|holding) the value (\d+) in)").at(0);
    std::set<std::string> out;
    for (const auto& [var, v] : value)
      if (v == asked) out.insert(var);
    return out;
  }
  if (task == "cwe") return most_frequent(all_matches(text, R"( \d+\. ([a-z]+))"), 10);
  if (task == "fwe") {
    const std::string body = text.substr(text.find('\n') + 1, text.rfind('\n') - text.find('\n') - 1);
    return most_frequent(all_matches(body, R"(([a-z]{4}))"), 3);
  }
  if (task.rfind("qa", 0) == 0) return {solve_story(text)};
  if (task == "mqar") {  // each asked key with the word after it, where a full stop follows that word
    const std::string context = text.substr(0, text.rfind('\n'));
    std::set<std::string> out;
    const std::string asked = all_matches(q, R"(the keys ([a-z, ]+)\?)").at(0);
    for (const std::string& key : all_matches(asked, R"(([a-z]+))")) {
      const std::vector<std::string> values = all_matches(context, " " + key + " ([a-z]+)\\.");
      EXPECT_EQ(values.size(), 1u) << key;
      if (!values.empty()) out.insert(key + " " + values[0]);
    }
    return out;
  }
  ADD_FAILURE() << "no solver for " << task;
  return {};
}

TEST(LongCtxTasks, EveryTaskFillsItsLengthAndAPerfectReaderFindsTheAnswer) {
  const Tokenizer& tok = test::small_tokenizer();
  for (const LongCtxWording wording : {LongCtxWording::Ruler, LongCtxWording::Paraphrased})
  for (const std::string& task : default_longctx_tasks()) {
    for (const int64_t length : {2048, 4096}) {
      for (uint64_t index = 0; index < 3; ++index) {
        SCOPED_TRACE(task + " at " + std::to_string(length) + ", sample " + std::to_string(index) + ", " + to_string(wording));
        const LongCtxSample s = sample(task, length, 0.5, index, false, wording);
        const int64_t used = int64_t(s.prompt.size()) + longctx_task(task).max_tokens;
        EXPECT_LE(used, length);
        EXPECT_GE(used, length * 9 / 10);  // filled, not a short prompt
        const std::string text = text_of(s);
        const std::vector<int32_t> whole = tok.encode(text);
        const size_t differ = size_t(std::mismatch(whole.begin(), whole.end(), s.prompt.begin(), s.prompt.end()).first - whole.begin());
        EXPECT_EQ(whole, s.prompt) << "the pieces' ids are not the text's from token " << differ << ": '"
                                   << tok.decode(std::span(whole).subspan(differ > 5 ? differ - 5 : 0, 10)) << "'";
        EXPECT_EQ(solve(task, text), std::set<std::string>(s.expected.begin(), s.expected.end()));
        EXPECT_EQ(share_found(text.substr(0, text.rfind('\n')), s.expected), 1.0) << "the answer is not in the context";
        const LongCtxSample again = sample(task, length, 0.5, index, false, wording);
        EXPECT_EQ(again.prompt, s.prompt);
        EXPECT_EQ(again.expected, s.expected);
      }
      EXPECT_NE(sample(task, length, 0.5, 0).prompt, sample(task, length, 0.5, 1).prompt);
    }
  }
}

// The paraphrased form asks the same facts in other words: the same expected answers, and neither
// the instruction nor the question is RULER's.
TEST(LongCtxTasks, ParaphrasedTemplatesAskTheSameFactsInOtherWords) {
  for (const std::string& task : default_longctx_tasks()) {
    SCOPED_TRACE(task);
    const LongCtxSample ruler = sample(task, 2048, 0.25, 1), other = sample(task, 2048, 0.25, 1, false, LongCtxWording::Paraphrased);
    EXPECT_EQ(other.expected, ruler.expected);
    const std::string a = text_of(ruler), b = text_of(other);
    EXPECT_NE(a.substr(0, a.find('\n')), b.substr(0, b.find('\n')));
    EXPECT_NE(question_of(a), question_of(b));
  }
  EXPECT_EQ(std::string(to_string(LongCtxWording::Paraphrased)), "paraphrased");
}

TEST(LongCtxTasks, TheNeedleSitsAtItsDepth) {
  for (const std::string task : {"passkey", "niah_single_essay", "niah_multikey", "niah_multikey_2", "niah_multikey_3"}) {
    for (const double depth : {0.0, 0.25, 0.5, 0.75, 1.0}) {
      const LongCtxSample s = sample(task, 8192, depth, 1);
      EXPECT_EQ(s.depth, depth);
      const std::string text = text_of(s);
      const size_t body = text.find('\n') + 1, question = text.rfind('\n');
      const size_t at = text.find(s.inserted.at(0));
      ASSERT_NE(at, std::string::npos);
      EXPECT_NEAR(double(at - body) / double(question - body), depth, 0.05) << task << " at depth " << depth;
    }
  }
  EXPECT_EQ(sample("vt_1x4", 2048).depth, -1);
}

TEST(LongCtxTasks, NoContextKeepsTheQuestionAndDropsEveryFact) {
  for (const std::string& task : default_longctx_tasks()) {
    const LongCtxSample full = sample(task, 2048), bare = sample(task, 2048, 0.5, 0, true);
    const std::string text = text_of(bare), full_text = text_of(full);
    EXPECT_EQ(test::small_tokenizer().encode(text), bare.prompt) << task;
    // The instruction (variable tracking's with its worked example) and the question.
    EXPECT_LT(bare.prompt.size(), task.rfind("vt_", 0) == 0 ? 1000u : 400u) << task;
    EXPECT_EQ(question_of(text), question_of(full_text)) << task;
    for (const std::string& fact : full.inserted) EXPECT_EQ(text.find(fact), std::string::npos) << task;
    EXPECT_LT(share_found(text, full.expected), 1.0) << task;
  }
}

TEST(LongCtxTasks, NamesScoringAndErrors) {
  EXPECT_EQ(longctx_task("vt_3x5").tier, LongCtxTier::Synthesis);
  EXPECT_EQ(longctx_task("vt_3x5").max_tokens, 10 + 6 * 6);
  EXPECT_TRUE(longctx_task("passkey").uses_depth);
  test::expect_error([] { longctx_task("vt_0x4"); }, "unknown long-context task 'vt_0x4'; known: passkey");
  test::expect_error([] { longctx_task("needle"); }, "unknown long-context task 'needle'");
  test::expect_error([] { sample("qa2", 256); }, "qa2 needs at least");
  EXPECT_EQ(share_found("The numbers are 12, 34 and 56.", {"12", "34", "78"}), 2.0 / 3.0);
  EXPECT_EQ(share_found("kitchen", {"Kitchen"}), 1.0);
  EXPECT_EQ(share_found("anything", {}), 0.0);
  test::expect_error([] { Haystack("\n\n", test::small_tokenizer()); }, "no sentences");
}

// A nano model answering over the suite: locally, and through `hyla serve` with the same ids.
struct NanoModelDir {
  test::TempDir dir;
  NanoModelDir() {
    Model model(test::nano_config([](nlohmann::json& j) { j["vocab_size"] = 512; }));
    model.initialize(5);
    test::TempDir staging;
    test::small_tokenizer().save(staging / "tokenizer.json");
    model.save(dir.path(), DType::F32, staging / "tokenizer.json");
  }
};

// The server's JSON holds bytes that are not UTF-8 (an untrained model's) as U+FFFD.
std::string as_served(const std::string& text) {
  return nlohmann::json::parse(nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))
      .get<std::string>();
}

TEST(LongCtxEval, LocalAndServedAnswersAgreeAndCellsAddUp) {
  const NanoModelDir nano;
  LongCtxOptions o;
  o.tasks = {"passkey", "qa1"};
  o.lengths = {512, 1024};
  o.depths = {0, 1};
  o.samples = 3;
  o.max_sequences = 1;
  o.prefill_chunk = 256;
  o.precision = Precision::F32;
  o.train_text = haystack_text();
  o.progress = false;
  auto model = Model::load(nano.dir.path());
  const LongCtxResult local = evaluate_longctx(model.get(), test::small_tokenizer(), haystack_text(), "sample text", o);
  ASSERT_EQ(local.cells.size(), 2u * 2u + 2u);  // passkey: 2 lengths × 2 depths; qa1: 2 lengths
  for (const LongCtxCell& c : local.cells) {
    EXPECT_EQ(c.samples, 3);
    EXPECT_LE(c.correct, c.samples);
    EXPECT_EQ(c.examples.size(), 2u);
  }
  EXPECT_EQ(local.cells[0].task, "passkey");
  EXPECT_EQ(local.cells[0].depth, 0.0);
  EXPECT_EQ(local.cells[4].depth, -1.0);
  ASSERT_EQ(local.lengths.size(), 2u);
  EXPECT_EQ(local.lengths[0].samples, 9);  // passkey: 2 depths × 3, qa1: 3
  EXPECT_GT(local.lengths[1].state_bytes_per_sequence, local.lengths[0].state_bytes_per_sequence);
  EXPECT_EQ(local.no_context.size(), 2u);
  EXPECT_TRUE(local.contamination_checked);
  EXPECT_EQ(local.contamination_samples, 18);
  EXPECT_EQ(local.contamination_found, 0);

  ServeOptions serve;
  serve.model_dir = nano.dir.path();
  serve.port = 0;
  serve.engine.max_sequences = 1;
  serve.engine.context = 1024;
  serve.engine.prefill_chunk = 256;
  serve.engine.precision = Precision::F32;
  serve.limits.context = 1024;
  Server server(serve);
  const int port = server.bind();
  std::thread listening([&] { server.listen(); });
  server.load();
  LongCtxOptions remote = o;
  remote.server = "http://127.0.0.1:" + std::to_string(port);
  const LongCtxResult served = evaluate_longctx(nullptr, test::small_tokenizer(), haystack_text(), "sample text", remote);
  server.stop();
  listening.join();
  ASSERT_EQ(served.cells.size(), local.cells.size());
  for (size_t i = 0; i < local.cells.size(); ++i) {
    EXPECT_EQ(served.cells[i].correct, local.cells[i].correct);
    for (size_t e = 0; e < local.cells[i].examples.size(); ++e)
      EXPECT_EQ(served.cells[i].examples[e].output, as_served(local.cells[i].examples[e].output)) << "cell " << i;
  }
  remote.server = "http://127.0.0.1:1";
  test::expect_error([&] { evaluate_longctx(nullptr, test::small_tokenizer(), haystack_text(), "t", remote); },
                     "--server http://127.0.0.1:1:");
}

TEST(LongCtxEval, ATaskIsSkippedAtALengthItDoesNotFitAndSaysWhy) {
  const NanoModelDir nano;
  LongCtxOptions o;
  o.tasks = {"passkey", "qa2"};
  o.lengths = {256, 1024};
  o.depths = {0.5};
  o.samples = 1;
  o.max_sequences = 1;
  o.precision = Precision::F32;
  o.progress = false;
  auto model = Model::load(nano.dir.path());
  const LongCtxResult r = evaluate_longctx(model.get(), test::small_tokenizer(), haystack_text(), "sample text", o);
  ASSERT_EQ(r.no_context.size(), 2u) << "qa2's control runs at the shortest length it fits";
  EXPECT_EQ(r.no_context[1].samples, 1);
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_EQ(r.skipped[0].task, "qa2");
  EXPECT_EQ(r.skipped[0].length, 256);
  EXPECT_NE(r.skipped[0].reason.find("qa2 needs at least"), std::string::npos) << r.skipped[0].reason;
  ASSERT_EQ(r.cells.size(), 3u);  // passkey at both lengths, qa2 at 1024 only
  EXPECT_EQ(r.cells[2].task, "qa2");
  EXPECT_EQ(r.cells[2].length, 1024);
  const nlohmann::ordered_json j = longctx_json(r);
  EXPECT_EQ(j["skipped"][0]["task"], "qa2");
  EXPECT_NE(longctx_html(r).find("Not run where the length cannot hold the task"), std::string::npos);
  o.tasks = {"qa2"};
  o.lengths = {256};
  test::expect_error([&] { evaluate_longctx(model.get(), test::small_tokenizer(), haystack_text(), "t", o); },
                     "no task fits any of the lengths: qa2 needs at least");
}

TEST(LongCtxCli, WritesResultsAndNamesBadArguments) {
  const NanoModelDir nano;
  test::TempDir out;
  test::write_bytes(out / "haystack.txt", haystack_text());
  const std::string base = "eval longctx -m " + nano.dir.path().string();
  const std::string common = base + " --haystack " + (out / "haystack.txt").string();
  const auto ok = test::run_hyla(common + " --tasks passkey,qa1 --lengths 512 --samples 2 --depths 0.5 --out " +
                                 (out / "r.json").string() + " --report " + (out / "r.html").string());
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("generator hyla-longctx-2, seed 1"), std::string::npos) << ok.output;
  const nlohmann::json r = parse_json_file((out / "r.json").string());
  EXPECT_EQ(r["generator"], "hyla-longctx-2");
  EXPECT_EQ(r["wording"], "ruler");
  EXPECT_EQ(r["cells"].size(), 2u);
  EXPECT_TRUE(std::filesystem::exists(out / "r.html"));
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {" --tasks passkey,nope", "unknown long-context task 'nope'"},
           {" --lengths 4X", "'4X' has an unknown unit"},
           {" --lengths 100", "length 100 is below 256 tokens"},
           {" --depths 0,2", "depth 2 is outside [0, 1]"},
           {" --memory 10%", "--memory 10%: give bytes with a unit"}}) {
    const auto bad = test::run_hyla(common + args);
    EXPECT_NE(bad.exit_code, 0) << args;
    EXPECT_NE(bad.output.find(message), std::string::npos) << args << ": " << bad.output;
  }
  const auto missing = test::run_hyla(base + " --haystack /nonexistent");
  EXPECT_NE(missing.output.find("--haystack /nonexistent: no such file"), std::string::npos) << missing.output;
}

TEST(LongCtxTrain, SamplesScoreTheAnswerRefuseTasksThatDoNotFitAndResume) {
  const Tokenizer& tok = test::small_tokenizer();
  test::TempDir dir;
  test::write_bytes(dir / "haystack.txt", haystack_text());
  const std::string file = (dir / "haystack.txt").string();
  LongCtxSampler a({"passkey", "qa2"}, file, tok, 7), b({"passkey", "qa2"}, file, tok, 7);
  ImageSequences sa, sb;
  a.next(1000, 512, {}, sa);
  EXPECT_GE(sa.rows(), 1000);
  const int32_t end = tok.special_id("<|endoftext|>");
  int64_t at = 0;
  for (const int64_t length : sa.lengths) {
    EXPECT_LE(length, 512);
    int64_t scored = 0, first_scored = -1;
    for (int64_t r = at; r < at + length; ++r)
      if (sa.targets[size_t(r)] >= 0) scored++, first_scored = first_scored < 0 ? r : first_scored;
    ASSERT_GT(scored, 2);
    for (int64_t r = first_scored; r < at + length; ++r) EXPECT_GE(sa.targets[size_t(r)], 0);  // the answer, then the end
    EXPECT_EQ(sa.targets[size_t(at + length - 1)], end);
    const std::string answer = tok.decode(std::span(sa.targets).subspan(size_t(first_scored), size_t(scored - 1)));
    EXPECT_EQ(answer.back(), '.') << answer;
    at += length;
  }
  b.set_state(a.state());
  a.next(700, 512, {}, sa);
  b.next(700, 512, {}, sb);
  EXPECT_EQ(sa.ids, sb.ids);
  EXPECT_EQ(sa.targets, sb.targets);
  // The shortest length a pass key fits holds no qa2 story: a stage listing qa2 there is refused.
  auto fits = [&](const char* task, int64_t length) {
    try {
      make_longctx_sample(longctx_task(task), haystack(), tok, length, 0.5, 1, 0);
      return true;
    } catch (const Error&) {
      return false;
    }
  };
  int64_t shortest = 64;
  while (!fits("passkey", shortest)) shortest += 8;
  ASSERT_FALSE(fits("qa2", shortest));
  LongCtxSampler c({"passkey", "qa2"}, file, tok, 7);
  const std::string refused = fmt::format("longctx: task qa2 does not fit a sequence of {} tokens", shortest);
  test::expect_error([&] { c.check_fit(shortest, {}); }, refused);
  test::expect_error([&] { c.next(10, shortest, {"qa2"}, sa); }, refused);
  c.next(4 * shortest, shortest, {"passkey"}, sa);
  EXPECT_GE(sa.lengths.size(), 4u);
  EXPECT_EQ(tok.decode(sa.ids).find("Where is"), std::string::npos);
  // A stage's subset: only its tasks are drawn.
  LongCtxSampler d({"passkey", "vt_1x2"}, file, tok, 7);
  d.next(8 * 1024, 1024, {"vt_1x2"}, sa);
  EXPECT_GE(sa.lengths.size(), 8u);
  EXPECT_EQ(tok.decode(sa.ids).find("pass key"), std::string::npos);
  EXPECT_NE(tok.decode(sa.ids).find("VAR "), std::string::npos);
  d.next(8 * 1024, 1024, {}, sa);
  EXPECT_NE(tok.decode(sa.ids).find("pass key"), std::string::npos);
}

// longctx.weights: a task weighted 3 against 1 is drawn about three times in four.
TEST(LongCtxTrain, TasksAreDrawnByWeight) {
  const Tokenizer& tok = test::small_tokenizer();
  test::TempDir dir;
  test::write_bytes(dir / "haystack.txt", haystack_text());
  LongCtxSampler sampler({"passkey", "vt_1x2"}, (dir / "haystack.txt").string(), tok, 7, {{"vt_1x2", 3.0}});
  ImageSequences s;
  constexpr int64_t kSamples = 200;
  sampler.next(kSamples * 1024, 1024, {}, s);
  ASSERT_GE(int64_t(s.lengths.size()), kSamples);
  int64_t at = 0, vt = 0;
  for (const int64_t length : s.lengths) {
    vt += tok.decode(std::span(s.ids).subspan(size_t(at), size_t(length))).find("VAR ") != std::string::npos;
    at += length;
  }
  const double share = double(vt) / double(s.lengths.size());
  EXPECT_GT(share, 0.65);  // 0.75 +- 3.3 standard deviations at 200 samples
  EXPECT_LT(share, 0.85);
}

// longctx.answer_share: the answers carry their share of the micro-batch's loss and the other
// scored rows the rest; the weights sum to the scored rows, so the loss stays a mean.
TEST(LongCtxTrain, AnswersCarryTheirShareOfTheLoss) {
  ModelInput in;
  in.targets = {1, 2, 3, 4, 5, 6, -1, -1, 7, 8};  // six text rows, then a sample: prompt, answer
  apply_loss_shares(in, {{6, 10, 0.5}});
  ASSERT_EQ(in.loss_weights.size(), 10u);
  for (int r = 0; r < 6; ++r) EXPECT_FLOAT_EQ(in.loss_weights[size_t(r)], 0.5f * 8 / 6);
  EXPECT_FLOAT_EQ(in.loss_weights[8], 0.5f * 8 / 2);
  EXPECT_FLOAT_EQ(in.loss_weights[9], 0.5f * 8 / 2);
  double sum = 0;
  for (int r = 0; r < 10; ++r) sum += in.targets[size_t(r)] >= 0 ? in.loss_weights[size_t(r)] : 0.0;
  EXPECT_NEAR(sum, 8.0, 1e-5);
  // Weights already there (a GRPO advantage, say) are scaled, not replaced.
  ModelInput weighted;
  weighted.targets = {1, 2, 3};
  weighted.loss_weights = {2, 2, 2};
  apply_loss_shares(weighted, {{2, 3, 0.25}});
  EXPECT_FLOAT_EQ(weighted.loss_weights[0], 2 * 0.75f * 3 / 2);
  EXPECT_FLOAT_EQ(weighted.loss_weights[2], 2 * 0.25f * 3 / 1);
  // No share, or a range with nothing scored: every scored row counts once.
  ModelInput plain;
  plain.targets = {1, 2, -1, -1};
  apply_loss_shares(plain, {{2, 4, 0.5}, {0, 0, 0.3}});
  apply_loss_shares(plain, {{0, 4, -1}});
  EXPECT_TRUE(plain.loss_weights.empty());
  // Only answers scored: they are the whole loss.
  ModelInput answers;
  answers.targets = {-1, 5, 6};
  apply_loss_shares(answers, {{0, 3, 0.5}});
  EXPECT_FLOAT_EQ(answers.loss_weights[1], 1.0f);
  EXPECT_FLOAT_EQ(answers.loss_weights[2], 1.0f);
}

TEST(LongCtxTrain, TrainConfigNamesBadTasksAndMissingHaystacks) {
  const nlohmann::json base = {{"curriculum", nlohmann::json::array({{{"seq_len", 256}, {"tokens", 1024}, {"batch_tokens", 512}}})}};
  nlohmann::json j = base;
  j["longctx"] = {{"ratio", 1.0}, {"tasks", {"passkey", "nope"}}, {"haystack", "h.txt"}};
  test::expect_error([&] { TrainConfig::from_json(j, "t.json"); }, "t.json: longctx.tasks: unknown long-context task 'nope'");
  j["longctx"] = {{"ratio", 1.0}, {"tasks", {"passkey"}}};
  test::expect_error([&] { TrainConfig::from_json(j, "t.json"); }, "longctx.haystack must name a text file");
  j["longctx"] = {{"ratio", 65.0}};
  test::expect_error([&] { TrainConfig::from_json(j, "t.json"); }, "longctx.ratio (65) must lie in [0, 64]");
  j["longctx"] = {{"ratio", 1.0}, {"tasks", {"passkey"}}, {"haystack", "h.txt"}, {"weights", {{"qa1", 2}}}};
  test::expect_error([&] { TrainConfig::from_json(j, "t.json"); }, "longctx.weights: 'qa1' is not in longctx.tasks (passkey)");
  j["longctx"]["weights"] = {{"passkey", 0}};
  test::expect_error([&] { TrainConfig::from_json(j, "t.json"); }, "longctx.weights.passkey (0) must be positive");
  j["longctx"]["weights"] = {{"passkey", "x"}};
  test::expect_error([&] { TrainConfig::from_json(j, "t.json"); }, "longctx.weights.passkey must be a number");
  j["longctx"].erase("weights");
  j["longctx"]["answer_share"] = 1.0;
  test::expect_error([&] { TrainConfig::from_json(j, "t.json"); }, "longctx.answer_share (1) must lie in (0, 1)");
  j["longctx"] = {{"ratio", 0.5}, {"tasks", {"vt_1x2", "passkey"}}, {"haystack", "h.txt"}, {"weights", {{"vt_1x2", 2.5}}},
                  {"answer_share", 0.4}};
  const TrainConfig c = TrainConfig::from_json(j, "t.json");
  const TrainConfig again = TrainConfig::from_json(c.to_json(), "again");
  EXPECT_EQ(again.longctx_tasks, (std::vector<std::string>{"vt_1x2", "passkey"}));
  EXPECT_EQ(again.longctx_weights, (std::map<std::string, double>{{"vt_1x2", 2.5}}));
  EXPECT_EQ(again.longctx_answer_share_of(0), 0.4);
  EXPECT_EQ(c.longctx_ratio_of(0), 0.5);
  j["curriculum"][0]["longctx_answer_share"] = 0.7;
  EXPECT_EQ(TrainConfig::from_json(TrainConfig::from_json(j, "t.json").to_json(), "again").longctx_answer_share_of(0), 0.7);
  j["curriculum"][0]["longctx_answer_share"] = 0;
  test::expect_error([&] { TrainConfig::from_json(j, "t.json"); }, "t.json: curriculum[0].longctx_answer_share (0) must lie in (0, 1)");
}

// A stage's own longctx_ratio and longctx_tasks replace the run's for that stage only, and need longctx set.
TEST(LongCtxTrain, AStagesOwnRatioAndTasksOverrideTheRuns) {
  nlohmann::json j = {{"curriculum", nlohmann::json::array({{{"seq_len", 256}, {"tokens", 1024}, {"batch_tokens", 512},
                                                             {"longctx_ratio", 15}},
                                                            {{"seq_len", 512}, {"tokens", 1024}, {"batch_tokens", 512}},
                                                            {{"seq_len", 512}, {"tokens", 1024}, {"batch_tokens", 512},
                                                             {"longctx_ratio", 0}}})},
                      {"longctx", {{"ratio", 1.0}, {"tasks", {"passkey"}}, {"haystack", "h.txt"}}}};
  const TrainConfig c = TrainConfig::from_json(j, "t.json");
  EXPECT_EQ(c.longctx_ratio_of(0), 15);
  EXPECT_EQ(c.longctx_ratio_of(1), 1);
  EXPECT_EQ(c.longctx_ratio_of(2), 0);
  const TrainConfig again = TrainConfig::from_json(c.to_json(), "again");
  EXPECT_EQ(again.longctx_ratio_of(0), 15);
  EXPECT_EQ(again.longctx_ratio_of(1), 1);
  EXPECT_FALSE(c.to_json()["curriculum"][1].contains("longctx_ratio"));
  j["curriculum"][0]["longctx_tasks"] = {"passkey"};
  EXPECT_EQ(TrainConfig::from_json(TrainConfig::from_json(j, "t.json").to_json(), "again").longctx_tasks_of(0),
            std::vector<std::string>{"passkey"});
  EXPECT_EQ(TrainConfig::from_json(j, "t.json").longctx_tasks_of(1), std::vector<std::string>{"passkey"});
  j["curriculum"][0]["longctx_tasks"] = {"qa1"};
  test::expect_error([&] { TrainConfig::from_json(j, "t.json"); },
                     "t.json: curriculum[0].longctx_tasks: 'qa1' is not in longctx.tasks (passkey)");
  j["curriculum"][0].erase("longctx_tasks");
  j["curriculum"][0]["longctx_ratio"] = 65;
  test::expect_error([&] { TrainConfig::from_json(j, "t.json"); }, "t.json: curriculum[0].longctx_ratio (65) must lie in [0, 64]");
  j["curriculum"][0]["longctx_ratio"] = 2;
  j.erase("longctx");
  test::expect_error([&] { TrainConfig::from_json(j, "t.json"); },
                     "t.json: curriculum[0].longctx_ratio is set but longctx.ratio is 0");
}

// `hyla train` with "longctx" mixes the samples into every step and resumes exactly.
TEST(LongCtxTrain, TrainsWithSyntheticSequencesAndResumesExactly) {
  test::TinyRun& t = test::tiny();
  test::TempDir dir;
  test::write_bytes(dir / "haystack.txt", haystack_text());
  const nlohmann::json train = {
      {"optimizer", {{"lr", 0.003}}},
      {"schedule", {{"warmup_steps", 2}}},
      {"curriculum", nlohmann::json::array({{{"seq_len", 512}, {"tokens", 4 * 512}, {"batch_tokens", 512}}})},
      {"longctx",
       {{"ratio", 0.5}, {"tasks", {"passkey", "niah_single_noise"}}, {"haystack", (dir / "haystack.txt").string()}, {"answer_share", 0.5}}},
      {"eval", {{"every", 0}}},
      {"checkpoint", {{"every", 2}, {"keep", 2}}}};
  test::write_bytes(dir / "train.json", train.dump());
  const std::string args = "train --config " + t.config + " --train " + (dir / "train.json").string() + " --data " +
                           t.data + " --deterministic --quiet --out ";
  const std::string whole = (dir / "whole").string(), resumed = (dir / "resumed").string();
  auto r = test::run_hyla(args + whole);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("longctx: passkey, niah_single_noise"), std::string::npos) << r.output;
  // A copy cut back to its earlier checkpoint continues as the whole run did.
  r = test::resume_copy_from_earlier_checkpoint(args, whole, resumed);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto a = test::metrics(whole), b = test::metrics(resumed);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["loss"].dump(), b[i]["loss"].dump()) << "step " << i + 1;
    EXPECT_GT(a[i]["tokens"].get<int64_t>(), 512) << "the synthetic rows join the text";
  }

  // A stage with longctx_ratio 0 trains on the text alone; one with a larger ratio takes more rows.
  nlohmann::json staged = train;
  staged["curriculum"] = nlohmann::json::array(
      {{{"seq_len", 512}, {"tokens", 2 * 512}, {"batch_tokens", 512}, {"longctx_ratio", 2}},
       {{"seq_len", 512}, {"tokens", 2 * 512}, {"batch_tokens", 512}, {"longctx_ratio", 0}}});
  staged["checkpoint"] = {{"every", 0}};
  test::write_bytes(dir / "staged.json", staged.dump());
  r = test::run_hyla("train --config " + t.config + " --train " + (dir / "staged.json").string() + " --data " + t.data +
                     " --deterministic --quiet --out " + (dir / "staged").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto s = test::metrics((dir / "staged").string());
  ASSERT_EQ(s.size(), 4u);
  for (size_t i = 0; i < 2; ++i) EXPECT_GE(s[i]["tokens"].get<int64_t>(), 3 * 512) << "step " << i + 1;
  for (size_t i = 2; i < 4; ++i) EXPECT_EQ(s[i]["tokens"].get<int64_t>(), 512) << "step " << i + 1;
}

}  // namespace
}  // namespace hyla
