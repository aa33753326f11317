// `hyla bench --model DIR`: prompt processing (ppP) and token generation (tgN) speed like
// llama-bench, optionally after `depth` tokens already in the context, batched decode of B
// sequences, and time to first token with a cached shared prefix. Decode rows also give the
// fraction of the memory-bandwidth roofline: bytes a token must read (active weights, recurrent
// state, latent cache) ÷ the bandwidth of reading the model's own weight buffers, measured in this
// process. With --expert-memory (docs/offload.md) every row also carries the expert cache's
// counters, and --text makes the test tokens real text so that routing is the real distribution.
#include "bench_model.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>

#include "bench_util.h"
#include "hyla/core/error.h"
#include "hyla/core/random.h"
#include "hyla/core/progress.h"
#include "hyla/core/threads.h"
#include "hyla/io/file.h"
#include "hyla/data/tokenizer.h"
#include "hyla/infer/engine.h"
#include "hyla/infer/sequence_state.h"
#include "hyla/kernels/bandwidth.h"
#include "hyla/model/model.h"
#include "hyla/model/param_count.h"

namespace hyla::cli {
namespace {

struct Stat {
  double mean = 0, std = 0;
};

// Mean and sample standard deviation of tokens/s over `reps` timed runs (after one warm-up).
Stat tokens_per_second(int reps, double tokens, const std::function<void()>& prepare, const std::function<void()>& run) {
  prepare();
  run();
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    prepare();
    const double t0 = now_seconds();
    run();
    rates.push_back(tokens / (now_seconds() - t0));
  }
  Stat s;
  for (double x : rates) s.mean += x / double(reps);
  for (double x : rates) s.std += (x - s.mean) * (x - s.mean) / std::max(1.0, double(reps - 1));
  s.std = std::sqrt(s.std);
  return s;
}

std::string human_bytes(double b) {
  return b >= double(1 << 30) ? fmt::format("{:.2f} GiB", b / double(1 << 30)) : fmt::format("{:.1f} MiB", b / double(1 << 20));
}

std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(int32_t(rng.below(uint64_t(vocab))));
  return ids;
}

}  // namespace

void bench_model(const ModelBenchArgs& a) {
  // The time-to-first-token runs (an Engine) come first, while this thread has no OpenMP pool of
  // its own: see load_model_for_engine.
  const std::unique_ptr<Model> model = load_model_for_engine(a.model_dir, a.load);
  ExpertOffload* offload = model->expert_offload();
  HYLA_CHECK(!a.cold_page_cache || offload, "bench: --cold-page-cache needs --expert-memory");
  const ModelConfig& config = model->config();
  const ParamCounts counts = count_parameters(config);
  const int64_t V = config.vocab_size, hidden = config.hidden_size;
  const std::string name = std::filesystem::path(a.model_dir).filename().string();
  // Weights a decoded token reads: every active parameter except the embedding table, of which it
  // reads one row.
  const double active_weights = double(counts.active_sum() - V * hidden + hidden);
  // A `hyla quantize` directory is timed as "int8": its products are int8, the few weights it keeps
  // floating point run bf16, and a weight costs 1 byte plus its block's f32 scale.
  int64_t int8_block = 0;
  for (const auto& p : model->params().params())
    if (p->is_int8()) int8_block = p->int8_block;
  const std::vector<std::string> dtypes = int8_block > 0 ? std::vector<std::string>{"int8"} : a.dtypes;
  const auto precision_of = [](const std::string& dtype) { return dtype == "f32" ? Precision::F32 : Precision::BF16; };
  const auto bytes_per_weight = [&](const std::string& dtype) {
    return dtype == "f32" ? 4.0 : dtype == "int8" ? 1.0 + 4.0 / double(int8_block) : 2.0;
  };

  int64_t max_depth = 0, max_gen = 0, max_prompt = 0;
  for (int64_t d : a.depths) max_depth = std::max(max_depth, d);
  for (int64_t n : a.generations) max_gen = std::max(max_gen, n);
  for (int64_t p : a.prompts) max_prompt = std::max(max_prompt, p);
  const int64_t capacity = max_depth + std::max(max_gen, max_prompt) + 2;

  std::vector<int32_t> text;
  if (!a.text_file.empty()) {
    const Tokenizer tokenizer = Tokenizer::load(std::filesystem::path(a.model_dir) / "tokenizer.json");
    text = tokenizer.encode(read_file(a.text_file));
    HYLA_CHECK(text.size() >= 2, "bench: --text {} encodes to fewer than 2 tokens", a.text_file);
  }
  // n test tokens: random ids, or a window of the text (cycled) that `seed` picks.
  const auto test_ids = [&](int64_t n, uint64_t seed) {
    if (text.empty()) return random_ids(n, V, seed);
    std::vector<int32_t> ids;
    const size_t start = size_t(seed * 7919) % text.size();
    for (int64_t i = 0; i < n; ++i) ids.push_back(text[(start + size_t(i)) % text.size()]);
    return ids;
  };

  nlohmann::json rows = nlohmann::json::array();
  if (a.ttft_prefix > 0) {
    const Tokenizer tokenizer = Tokenizer::load(std::filesystem::path(a.model_dir) / "tokenizer.json");
    std::vector<int32_t> shared = random_ids(a.ttft_prefix, std::min<int64_t>(V, tokenizer.vocab_size()), 5);
    const auto request = [&](uint64_t seed) {
      GenerationRequest r;
      r.prompt = shared;
      const auto tail = random_ids(64, std::min<int64_t>(V, tokenizer.vocab_size()), seed);
      r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
      r.max_tokens = 1;
      r.sampling.temperature = 0;
      r.stop_at_end_tokens = false;
      return r;
    };
    for (const std::string& dtype : dtypes) {
      EngineOptions o;
      o.max_sequences = 1;
      o.context = a.ttft_prefix + 128;
      o.prefill_chunk = a.prefill_chunk;
      o.precision = precision_of(dtype);
      for (const bool cached : {false, true}) {
        o.prefix_cache_bytes = cached ? int64_t(1) << 30 : 0;
        Engine engine(*model, tokenizer, o);
        engine.submit(request(100)).get();  // warm-up, and the cached prefix
        std::vector<double> ttft;
        for (int r = 0; r < a.reps; ++r) ttft.push_back(engine.submit(request(uint64_t(200 + r))).get().time_to_first_token);
        double mean = 0, sd = 0;
        for (double t : ttft) mean += t / double(a.reps);
        for (double t : ttft) sd += (t - mean) * (t - mean) / std::max(1.0, double(a.reps - 1));
        sd = std::sqrt(sd);
        const std::string test = fmt::format("ttft {}+64 {}", a.ttft_prefix, cached ? "cached prefix" : "cold");
        rows.push_back({{"model", name}, {"dtype", dtype}, {"threads", num_threads()}, {"test", test},
                        {"seconds", mean}, {"std", sd}});
        if (!a.json)
          fmt::print("{} {} threads {}: time to first token {:.1f} ± {:.1f} ms\n", dtype, test, num_threads(), mean * 1e3,
                     sd * 1e3);
      }
    }
    if (!a.json) fmt::print("\n");
  }
  const double fresh_bandwidth = measure_read_bandwidth_gbs() * 1e9;
  if (!a.json) fmt::print("read bandwidth this run: {:.1f} GB/s over a fresh 512 MB buffer\n", fresh_bandwidth * 1e-9);
  // The roofline's reference: the bandwidth of reading the very weight buffers decoding reads
  // (same pages, same page sizes), measured next to a fresh buffer's figure.
  std::map<std::string, double> weights_bandwidth;
  for (const std::string& dtype : dtypes) {
    weights_bandwidth[dtype] = measure_read_bandwidth_gbs(model->params().product_weight_buffers(dtype == "f32")) * 1e9;
    if (!a.json)
      fmt::print("read bandwidth this run: {:.1f} GB/s over the model's {} weights (the roofline's reference)\n",
                 weights_bandwidth[dtype] * 1e-9, dtype);
  }
  if (!a.json) {
    fmt::print("state memory per sequence: {}\n", SequenceState(*model, capacity).describe_memory(capacity));
    fmt::print("\n| model | size | params | dtype | threads | test | t/s | roofline |\n");
    fmt::print("| --- | ---: | ---: | --- | ---: | --- | ---: | ---: |\n");
  }
  std::vector<int64_t> thread_counts = a.threads.empty() ? std::vector<int64_t>{num_threads()} : a.threads;
  int64_t batched = 0;
  for (int64_t B : a.batches) batched += B > 1;
  const int64_t per_setting = int64_t(a.depths.size()) * int64_t(a.prompts.size() + a.generations.size()) +
                              batched * int64_t(a.generations.size());
  // The table's rows show progress as they come; --json prints at the end, so it gets a bar on stderr.
  std::optional<Progress> progress;
  if (a.json) progress.emplace("bench", uint64_t(int64_t(dtypes.size() * thread_counts.size()) * per_setting), "tests");
  for (const std::string& dtype : dtypes) {
    const Precision precision = precision_of(dtype);
    const double weight_bytes = bytes_per_weight(dtype);
    const double model_bytes = double(counts.total_sum()) * weight_bytes;
    const double bandwidth = weights_bandwidth.at(dtype);
    for (int64_t threads : thread_counts) {
      set_threads(int(threads));
      SequenceState state(*model, capacity), at_depth(*model, capacity);
      // With offload, every repetition's counters start at zero (and, cold, with nothing resident
      // or in the page cache): a row reports its last repetition's.
      const auto timed = [&](double tokens, const std::function<void()>& prepare, const std::function<void()>& run) {
        return tokens_per_second(a.reps, tokens,
                                 [&] {
                                   prepare();
                                   if (!offload) return;
                                   if (a.cold_page_cache) offload->evict_all(/*drop_page_cache=*/true);
                                   offload->reset_stats();
                                 },
                                 run);
      };
      const auto emit = [&](const std::string& test, Stat s, double roof_tokens_per_s) {
        const double roof = roof_tokens_per_s > 0 ? s.mean / roof_tokens_per_s : 0;
        nlohmann::json row = {{"model", name}, {"size_bytes", model_bytes}, {"params", counts.total_sum()},
                              {"dtype", dtype}, {"threads", threads}, {"test", test}, {"tokens_per_s", s.mean},
                              {"std", s.std}, {"roofline_fraction", roof}, {"bandwidth_gbs", bandwidth * 1e-9}};
        std::string offload_line;
        if (offload) {
          const ExpertOffloadStats o = offload->stats();
          const ExpertLayerStats t = o.total();
          nlohmann::json by_layer = nlohmann::json::array();
          for (const ExpertLayerStats& l : o.layers) by_layer.push_back(l.hit_rate());
          row.update({{"expert_memory_bytes", offload->resident_bytes()},
                      {"expert_slots_per_layer", o.slots_per_layer},
                      {"expert_cache", expert_cache_policy_name(offload->options().policy)},
                      {"expert_prefetch", offload->options().prefetch},
                      {"page_cache", a.cold_page_cache ? "cold" : "warm"},
                      {"expert_hit_rate", t.hit_rate()},
                      {"expert_hit_rate_by_layer", by_layer},
                      {"prefetch_precision", t.precision()},
                      {"prefetch_recall", t.recall()},
                      {"expert_bytes_per_token", o.bytes_per_token()},
                      {"expert_stall_ms_per_token", o.stall_seconds_per_token() * 1e3}});
          offload_line = fmt::format("|  | experts | {} slots/layer, {} |  |  | hit {:.1f}% | prefetch p {:.0f}% r {:.0f}% | "
                                     "{:.2f} MB, {:.3f} ms stalled per token |\n",
                                     o.slots_per_layer, a.cold_page_cache ? "cold" : "warm", 100 * t.hit_rate(),
                                     100 * t.precision(), 100 * t.recall(), o.bytes_per_token() * 1e-6,
                                     o.stall_seconds_per_token() * 1e3);
        }
        rows.push_back(row);
        if (progress) progress->advance(1);
        if (!a.json)
          fmt::print("| {} | {} | {:.1f} M | {} | {} | {} | {:.1f} ± {:.1f} | {} |\n{}", name, human_bytes(model_bytes),
                     double(counts.total_sum()) * 1e-6, dtype, threads, test, s.mean, s.std,
                     roof > 0 ? fmt::format("{:.0f}%", 100 * roof) : "", offload_line);
      };
      for (int64_t depth : a.depths) {
        const std::string at = depth > 0 ? fmt::format(" @ d{}", depth) : "";
        at_depth.reset();
        if (depth > 0) feed(*model, test_ids(depth, 1), at_depth, a.prefill_chunk, precision);
        for (int64_t p : a.prompts) {
          const std::vector<int32_t> ids = test_ids(p, 2);
          emit(fmt::format("pp{}{}", p, at),
               timed(double(p), [&] { state.copy_from(at_depth); },
                                 [&] { feed(*model, ids, state, a.prefill_chunk, precision); }),
               0);
        }
        for (int64_t n : a.generations) {
          // After the depth's tokens, as a continuation of the same text.
          const std::vector<int32_t> ids = test_ids(depth + n, 1);
          // Bytes per generated token: weights, the KDA states read and written, and the latent
          // cache read (at the mean position of the run).
          const double bytes = active_weights * weight_bytes + 2.0 * double(state.fixed_bytes()) +
                               double(state.bytes_per_token()) * (double(depth) + double(n) / 2);
          emit(fmt::format("tg{}{}", n, at),
               timed(double(n), [&] { state.copy_from(at_depth); },
                                 [&] {
                                   for (size_t i = size_t(depth); i < ids.size(); ++i)
                                     feed(*model, {ids[i]}, state, 1, precision);
                                 }),
               bandwidth / bytes);
        }
      }
      // Batched decode: B sequences, one token each per forward.
      for (int64_t B : a.batches) {
        if (B <= 1) continue;
        std::vector<std::unique_ptr<SequenceState>> states;
        for (int64_t b = 0; b < B; ++b) states.push_back(std::make_unique<SequenceState>(*model, max_gen + 20));
        for (int64_t n : a.generations) {
          const auto prepare = [&] {
            for (int64_t b = 0; b < B; ++b) {
              states[size_t(b)]->reset();
              feed(*model, test_ids(16, uint64_t(10 + b)), *states[size_t(b)], 16, precision);
            }
          };
          const auto run = [&] {
            std::vector<SequenceCache> caches(static_cast<size_t>(B));
            for (int64_t step = 0; step < n; ++step) {
              ModelInput in;
              std::vector<int64_t> ones(static_cast<size_t>(B), 1), offsets;
              for (int64_t b = 0; b < B; ++b) {
                caches[size_t(b)] = states[size_t(b)]->cache();
                offsets.push_back(states[size_t(b)]->length());
                in.ids.push_back(text.empty() ? int32_t((step * 131 + b * 17) % V)
                                              : text[size_t(b * 1009 + step) % text.size()]);
              }
              in.tokens = TokenBatch::packed(ones, offsets);
              model->forward(in, {.precision = precision}, caches);
              for (int64_t b = 0; b < B; ++b) states[size_t(b)]->cache() = caches[size_t(b)];
            }
          };
          // The weights are read once per step for all B sequences (experts: up to B·k of E).
          emit(fmt::format("tg{} ×{} (aggregate)", n, B), timed(double(n * B), prepare, run), 0);
        }
      }
    }
  }
  if (progress) progress->finish();
  if (a.json) fmt::print("{}\n", rows.dump(2));
}

}  // namespace hyla::cli
