// `hyla bench --model DIR`: prompt processing (ppP) and token generation (tgN) speed like
// llama-bench, optionally after `depth` tokens already in the context, batched decode of B
// sequences, and time to first token with a cached shared prefix. Decode rows also give the
// fraction of a roofline that knows the cache (DecodeBound): the time to read a token's bytes,
// those the last-level cache holds at its bandwidth and the rest at DRAM's, and at depth the token
// mixers' FLOPs at the GEMM peak where those take longer than their bytes, all measured in this
// process with the row's threads. With --expert-memory (docs/offload.md) every row also carries
// the expert cache's counters, and --text makes the test tokens real text so that routing is the
// real distribution. With --image, an image's prefill: patches/s through the vision tower and
// tokens/s through the whole model.
#include "bench_model.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>

#include "bench_util.h"
#include "hyla/core/error.h"
#include "hyla/core/random.h"
#include "hyla/core/progress.h"
#include "hyla/core/threads.h"
#include "hyla/io/file.h"
#include "hyla/data/image_file.h"
#include "hyla/data/model_tokenizer.h"
#include "hyla/data/tokenizer.h"
#include "hyla/infer/engine.h"
#include "hyla/infer/sequence_state.h"
#include "hyla/kernels/bandwidth.h"
#include "hyla/kernels/matmul.h"
#include "hyla/model/model.h"
#include "hyla/model/param_count.h"

namespace hyla::cli {
namespace {

struct Stat {
  double mean = 0, std = 0;
};

// Mean and sample standard deviation of tokens/s over `reps` timed runs (after one warm-up).
// run(repetition): 0 is the warm-up, 1..reps the timed runs.
Stat tokens_per_second(int reps, double tokens, const std::function<void()>& prepare,
                       const std::function<void(int)>& run) {
  prepare();
  run(0);
  std::vector<double> rates;
  for (int r = 1; r <= reps; ++r) {
    prepare();
    const double t0 = now_seconds();
    run(r);
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

// The least time a decoded token can take reading its bytes: a plain read of buffers laid out
// like them, in their order (TokenReadBench), so that what the caches hold is measured, not
// guessed. Two kinds: the bytes it re-reads every token (every active weight but the routed
// experts, one embedding row, the KDA states read and written, the latent cache), and the routed
// experts' (k of E per MoE layer, a different few each token, from the pool of all of them). Each
// kind is named after the memory its measured rate says it came from: the last-level cache when
// it read well above a 512 MB buffer's DRAM rate, else DRAM.
//
// The token mixers (KDA state updates, latent attention over the cache) also do arithmetic that
// grows with the position: at depth their FLOPs, at the GEMM peak measured in the same process,
// can take longer than reading their bytes (the KDA states and the latent cache). The mixers and
// the weight products run one after the other, so the bound is the bytes' read time plus, for
// the mixers, how much longer their FLOPs at the peak take than their bytes.
struct DecodeBound {
  double reread_bytes = 0, routed_bytes = 0;
  TokenReadTime read;
  double dram_bandwidth = 0;        // bytes/s
  double mixer_read_seconds = 0;    // the mixers' share of the re-read bytes' time
  double mixer_flops = 0, peak_flops = 0;  // per token; FLOP/s

  static DecodeBound of(double reread, double routed, double mixer_bytes, double mixer_flops, const TokenReadTime& read,
                        double dram_bandwidth, double peak_flops) {
    return {reread, routed, read, dram_bandwidth, read.reread_seconds * mixer_bytes / std::max(reread, 1.0),
            mixer_flops, peak_flops};
  }
  double reread_bandwidth() const { return reread_bytes / std::max(read.reread_seconds, 1e-30); }
  double routed_bandwidth() const { return routed_bytes / std::max(read.routed_seconds, 1e-30); }
  // Well above DRAM's rate: served by the last-level cache.
  const char* tier(double bandwidth) const { return bandwidth > 1.25 * dram_bandwidth ? "LLC" : "DRAM"; }
  double flop_seconds() const { return mixer_flops / peak_flops; }
  bool flop_bound() const { return flop_seconds() > mixer_read_seconds; }
  double seconds() const { return read.seconds + std::max(0.0, flop_seconds() - mixer_read_seconds); }
  std::string where() const {
    std::string routed;
    if (routed_bytes > 0)
      routed = fmt::format(" + {:.1f} MB routed at {:.1f} GB/s ({})", routed_bytes * 1e-6, routed_bandwidth() * 1e-9,
                           tier(routed_bandwidth()));
    return fmt::format("{:.1f} MB re-read at {:.1f} GB/s ({}){}; mixers {:.1f} MFLOP at {:.0f} GFLOP/s, {}",
                       reread_bytes * 1e-6, reread_bandwidth() * 1e-9, tier(reread_bandwidth()), routed,
                       mixer_flops * 1e-6, peak_flops * 1e-9, flop_bound() ? "FLOP-bound" : "byte-bound");
  }
};

// A decoded token's token-mixer FLOPs at `position` (tokens before it): a KDA layer decays,
// reads, updates and reads out each head's d×d state (~7 d² FLOPs a head); a latent-attention
// layer scores each cached row against the absorbed query (2·(rank + rope) a head) and sums the
// rows' latents (2·rank a head); a sliding-window layer only over its window.
double mixer_flops_per_token(const ModelConfig& c, double position) {
  double flops = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerType type = c.layer_types[size_t(l)];
    if (type == LayerType::Kda) {
      flops += 7.0 * double(c.kda.num_heads * c.kda.head_dim * c.kda.head_dim);
      continue;
    }
    const double rows = type == LayerType::Swa ? std::min(position + 1, double(c.mla.sliding_window)) : position + 1;
    flops += rows * double(c.mla.num_heads) * 2.0 * double(2 * c.mla.kv_lora_rank + c.mla.qk_rope_head_dim);
  }
  return flops;
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
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) moe_layers += config.is_moe_layer(l);
  const int64_t experts = moe_layers > 0 ? config.moe.num_experts : 0;
  // A `hyla quantize` directory is timed as "int8": its products are int8, the few weights it keeps
  // floating point run bf16, and a weight costs 1 byte plus its block's f32 scale.
  // A GGUF whose matrices are multiplied from its blocks (K, IQ, legacy types) is timed as "gguf":
  // its products read the file's bytes, and a model's size is what its parameters hold.
  int64_t int8_block = 0;
  bool ggml_blocks = false;
  for (const auto& p : model->params().params()) {
    if (p->is_int8()) int8_block = p->int8_block;
    ggml_blocks = ggml_blocks || p->is_ggml();
  }
  const std::vector<std::string> dtypes = ggml_blocks      ? std::vector<std::string>{"gguf"}
                                          : int8_block > 0 ? std::vector<std::string>{"int8"}
                                                           : a.dtypes;
  const auto precision_of = [](const std::string& dtype) { return dtype == "f32" ? Precision::F32 : Precision::BF16; };
  const auto bytes_per_weight = [&](const std::string& dtype) {
    return dtype == "f32" ? 4.0 : dtype == "int8" ? 1.0 + 4.0 / double(int8_block) : 2.0;
  };
  // The weight bytes a decoded token reads (DecodeBound), each parameter as the ops read it: int8
  // products at 1 + 4/block bytes a weight, MXFP4 experts at 0.5 + 1/32, the other matrix
  // products' weights at the products' width (2 bytes in bf16, 4 in f32), and in f32 whatever stays floating point for its op (the
  // router, latent attention's kv_b absorbed into the query, norms, AttnRes queries, gates' and
  // convolutions' small tensors); of the embedding table one row (read as the tied head's matrix
  // too). The routed experts apart: one expert's bytes (the pool holds E per MoE layer).
  struct WeightReads {
    double reread = 0, expert = 0;
  };
  const auto weight_reads = [&](Precision precision) {
    WeightReads w;
    double routed = 0;
    for (const auto& p : model->params().params()) {
      const double n = double(p->numel());
      const bool product = p->int8_allowed && p->shape.ndim() == 2;
      double bytes = p->is_int8()    ? n * (1.0 + 4.0 / double(p->int8_block))
                     : p->is_mxfp4() ? n * (0.5 + 1.0 / 32.0)
                     : p->is_ggml()  ? double(p->ggml.row_bytes()) * double(p->shape[0])
                                     : n * (product && precision == Precision::BF16 ? 2.0 : 4.0);
      if (p->component == Component::Vision) continue;  // images only
      if (p->name == "model.embed_tokens.weight")
        bytes = double(hidden) * 4.0 +
                (config.tie_word_embeddings ? n * (precision == Precision::BF16 ? 2.0 : 4.0) : 0.0);
      if (p->component == Component::RoutedExperts) routed += bytes;
      else w.reread += bytes;
    }
    w.expert = experts > 0 ? routed / double(moe_layers * experts) : 0;
    return w;
  };

  int64_t max_depth = 0, max_gen = 0, max_prompt = 0;
  for (int64_t d : a.depths) max_depth = std::max(max_depth, d);
  for (int64_t n : a.generations) max_gen = std::max(max_gen, n);
  for (int64_t p : a.prompts) max_prompt = std::max(max_prompt, p);
  const int64_t max_new = std::max(max_gen, max_prompt), capacity = max_depth + max_new + 2;
  // Checked before any prefill: a deep run fails here, not after its depth's minutes of prefill.
  HYLA_CHECK(max_depth + max_new <= config.max_position_embeddings,
             "bench: depth {} + {} tokens reach past the model's max_position_embeddings ({})", max_depth, max_new,
             config.max_position_embeddings);

  std::vector<int32_t> text;
  if (!a.text_file.empty()) {
    const Tokenizer tokenizer = load_model_tokenizer(a.model_dir);
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

  std::optional<Image> image;
  int64_t image_tokens = 0, image_patches = 0;
  if (!a.image_file.empty()) {
    HYLA_CHECK(config.vision.enabled && config.vision.tower == VisionTower::MoonVit,
               "bench: --image needs a model with a MoonViT tower (or --mmproj)");
    image = to_model_image(read_image_file(a.image_file), config.vision, a.image_file);
    image_tokens = patch_count(*image, config.vision);
    image_patches = (image->height / config.vision.patch_size) * (image->width / config.vision.patch_size);
  }

  nlohmann::json rows = nlohmann::json::array();
  if (a.ttft_prefix > 0) {
    const Tokenizer tokenizer = load_model_tokenizer(a.model_dir);
    // Requests go through the scheduler, which refuses control tokens out of place (an image pad
    // without its image): ordinary tokens only.
    const auto ordinary_ids = [&](int64_t n, uint64_t seed) {
      std::vector<int32_t> ids = random_ids(n, std::min<int64_t>(V, tokenizer.vocab_size()), seed);
      for (int32_t& id : ids)
        while (tokenizer.is_special(id)) id = int32_t((id + 1) % std::min<int64_t>(V, tokenizer.vocab_size()));
      return ids;
    };
    std::vector<int32_t> shared = ordinary_ids(a.ttft_prefix, 5);
    const auto request = [&](uint64_t seed) {
      GenerationRequest r;
      r.prompt = shared;
      const auto tail = ordinary_ids(64, seed);
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
      o.snapshot_interval = a.snapshot_every;
      for (const bool cached : {false, true}) {
        o.prefix_cache_bytes = cached ? int64_t(4) << 30 : 0;
        Engine engine(*model, tokenizer, o);
        if (cached) {
          engine.submit(request(100)).get();  // the first turn, which leaves its snapshots
        } else {
          GenerationRequest warm_up = request(100);  // primitives and buffers, not the whole prefill again
          warm_up.prompt.resize(std::min<size_t>(warm_up.prompt.size(), size_t(a.prefill_chunk) + 1));
          engine.submit(warm_up).get();
        }
        std::vector<double> ttft;
        for (int r = 0; r < a.reps; ++r) ttft.push_back(engine.submit(request(uint64_t(200 + r))).get().time_to_first_token);
        double mean = 0, sd = 0;
        for (double t : ttft) mean += t / double(a.reps);
        for (double t : ttft) sd += (t - mean) * (t - mean) / std::max(1.0, double(a.reps - 1));
        sd = std::sqrt(sd);
        const std::string test = fmt::format("ttft {}+64 {}", a.ttft_prefix, cached ? "cached prefix" : "cold");
        const EngineStats stats = engine.stats();
        rows.push_back({{"model", name}, {"dtype", dtype}, {"threads", num_threads()}, {"test", test},
                        {"seconds", mean}, {"std", sd}, {"snapshot_every", a.snapshot_every},
                        {"snapshots", stats.prompt_state_snapshots}, {"snapshot_bytes", stats.prompt_state_bytes}});
        if (!a.json)
          fmt::print("{} {} threads {}: time to first token {:.1f} ± {:.1f} ms{}\n", dtype, test, num_threads(),
                     mean * 1e3, sd * 1e3,
                     cached ? fmt::format(" ({} snapshots every {} tokens, {})", stats.prompt_state_snapshots,
                                          a.snapshot_every, human_bytes(stats.prompt_state_bytes))
                            : std::string());
      }
    }
    if (!a.json) fmt::print("\n");
  }
  const SequenceState probe(*model, capacity);
  if (!a.json && offload)
    fmt::print("decode rows' roofline: none (the offloaded experts come from the files: docs/offload.md's disk bound)\n");
  else if (!a.json)
    fmt::print("decode rows' roofline: a plain read of a token's bytes laid out and ordered as the token reads them "
               "(re-read bytes, and {} of {} routed experts per MoE layer), with the row's threads; each kind named "
               "after the memory its rate says served it (last-level cache: well above DRAM's 512 MB rate)\n",
               config.moe.num_experts_per_tok, experts);
  if (!a.json) {
    fmt::print("state memory per sequence: {}\n", probe.describe_memory(capacity));
    fmt::print("\n| model | size | params | dtype | threads | test | t/s | roofline (cache-aware) |\n");
    fmt::print("| --- | ---: | ---: | --- | ---: | --- | ---: | ---: |\n");
  }
  // Without -t, the configuration the CLI chose (by default adaptive: fewer threads while other
  // processes keep cores busy); each -t value is a fixed count.
  std::vector<ThreadConfig> thread_settings;
  if (a.threads.empty()) thread_settings.push_back(thread_config());
  for (int64_t t : a.threads) thread_settings.push_back({int(t), false});
  int64_t batched = 0;
  for (int64_t B : a.batches) batched += B > 1;
  const int64_t per_setting = int64_t(a.depths.size()) * int64_t(a.prompts.size() + a.generations.size()) +
                              batched * int64_t(a.generations.size());
  // The table's rows show progress as they come; --json prints at the end, so it gets a bar on stderr.
  std::optional<Progress> progress;
  if (a.json) progress.emplace("bench", uint64_t(int64_t(dtypes.size() * thread_settings.size()) * per_setting), "tests");
  for (const std::string& dtype : dtypes) {
    const Precision precision = precision_of(dtype);
    double model_bytes = double(counts.total_sum()) * bytes_per_weight(dtype);
    if (ggml_blocks) {
      model_bytes = 0;
      for (const auto& p : model->params().params())
        model_bytes += p->is_ggml() ? double(p->ggml.row_bytes()) * double(p->shape[0])
                       : p->is_int8() ? double(p->numel()) * (1.0 + 4.0 / double(p->int8_block))
                                      : double(p->numel()) * 4.0;
    }
    const WeightReads weights = weight_reads(precision);
    const double routed_bytes = weights.expert * double(moe_layers * config.moe.num_experts_per_tok);
    const auto reread_at = [&](double position) {  // a token's re-read bytes, and the mixers' share of them
      const double mixer_bytes = 2.0 * double(probe.fixed_bytes()) + double(probe.bytes_per_token()) * position;
      return std::pair{weights.reread + mixer_bytes, mixer_bytes};
    };
    // Not with offload: its buffer would hold every expert, which is what does not fit.
    std::optional<TokenReadBench> reads;
    if (!offload) reads.emplace(int64_t(reread_at(double(capacity)).first), moe_layers, experts, int64_t(weights.expert));
    for (const ThreadConfig& setting : thread_settings) {
      set_thread_config(setting);
      const int64_t threads = setting.threads;
      const std::string threads_label = setting.adaptive ? fmt::format("{} (adaptive)", threads) : std::to_string(threads);
      // Measured beside this setting's rows: a 512 MB buffer, the DRAM rate the tiers are named by.
      const double dram_bandwidth = measure_read_bandwidth_gbs() * 1e9;
      // The mixers' arithmetic runs in the products' precision (an int8 model's attention in bf16).
      const double peak_flops = measure_gemm_peak_gflops(precision == Precision::BF16) * 1e9;
      if (!a.json)
        fmt::print("|  | read bandwidth, GEMM peak | {} threads |  |  | DRAM {:.1f} GB/s | {} {:.0f} GFLOP/s |\n",
                   threads_label, dram_bandwidth * 1e-9, dtype == "f32" ? "f32" : "bf16", peak_flops * 1e-9);
      SequenceState state(*model, capacity), at_depth(*model, capacity);
      // With offload, every repetition's counters start at zero (and, cold, with nothing resident
      // or in the page cache): a row reports its last repetition's.
      // Each repetition, the warm-up included, reads its own tokens: with offload, a warm-up that
      // read the timed run's very tokens would leave their experts resident.
      const auto timed = [&](double tokens, const std::function<void()>& prepare, const std::function<void(int)>& run) {
        return tokens_per_second(a.reps, tokens,
                                 [&] {
                                   prepare();
                                   if (!offload) return;
                                   if (a.cold_page_cache) offload->evict_all(/*drop_page_cache=*/true);
                                   offload->reset_stats();
                                 },
                                 run);
      };
      const auto emit = [&](const std::string& test, Stat s, const DecodeBound* bound) {
        const double roof = bound ? s.mean * bound->seconds() : 0;
        nlohmann::json row = {{"model", name}, {"size_bytes", model_bytes}, {"params", counts.total_sum()},
                              {"dtype", dtype}, {"threads", threads}, {"adaptive_threads", setting.adaptive},
                              {"test", test}, {"tokens_per_s", s.mean},
                              {"std", s.std}, {"dram_gbs", dram_bandwidth * 1e-9},
                              {"gemm_peak_gflops", peak_flops * 1e-9}};
        if (bound)
          row.update({{"roofline_fraction", roof},
                      {"roofline_tokens_per_s", 1.0 / bound->seconds()},
                      {"reread_bytes", bound->reread_bytes},
                      {"routed_bytes", bound->routed_bytes},
                      {"reread_gbs", bound->reread_bandwidth() * 1e-9},
                      {"routed_gbs", bound->routed_bandwidth() * 1e-9},
                      {"reread_tier", bound->tier(bound->reread_bandwidth())},
                      {"routed_tier", bound->tier(bound->routed_bandwidth())},
                      {"mixer_flops", bound->mixer_flops},
                      {"mixers_flop_bound", bound->flop_bound()}});
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
                      {"expert_top20_share", o.mean_top_share(0.2)},
                      {"prefetch_precision", t.precision()},
                      {"prefetch_recall", t.recall()},
                      {"expert_bytes_per_token", o.bytes_per_token()},
                      {"expert_stall_ms_per_token", o.stall_seconds_per_token() * 1e3}});
          offload_line = fmt::format("|  | experts | {} slots/layer, {} | top 20% routed {:.0f}% |  | hit {:.1f}% | "
                                     "prefetch p {:.0f}% r {:.0f}% | {:.2f} MB, {:.3f} ms stalled per token |\n",
                                     o.slots_per_layer, a.cold_page_cache ? "cold" : "warm",
                                     100 * o.mean_top_share(0.2), 100 * t.hit_rate(),
                                     100 * t.precision(), 100 * t.recall(), o.bytes_per_token() * 1e-6,
                                     o.stall_seconds_per_token() * 1e3);
        }
        rows.push_back(row);
        if (progress) progress->advance(1);
        if (!a.json)
          fmt::print("| {} | {} | {:.1f} M | {} | {} | {} | {:.1f} ± {:.1f} | {} |\n{}", name, human_bytes(model_bytes),
                     double(counts.total_sum()) * 1e-6, dtype, threads_label, test, s.mean, s.std,
                     bound ? fmt::format("{:.0f}% of {:.0f} ({})", 100 * roof, 1.0 / bound->seconds(), bound->where())
                           : "",
                     offload_line);
      };
      for (int64_t depth : a.depths) {
        const std::string at = depth > 0 ? fmt::format(" @ d{}", depth) : "";
        at_depth.reset();
        if (depth > 0) feed(*model, test_ids(depth, 1), at_depth, a.prefill_chunk, precision);
        for (int64_t p : a.prompts) {
          emit(fmt::format("pp{}{}", p, at),
               timed(double(p), [&] { state.copy_from(at_depth); },
                                 [&](int repetition) {
                                   feed(*model, test_ids(p, uint64_t(2 + 100 * repetition)), state, a.prefill_chunk,
                                        precision);
                                 }),
               nullptr);
        }
        for (int64_t n : a.generations) {
          // After the depth's tokens: in the warm-up, the same text's continuation; in a timed run,
          // another window's.
          const auto ids = [&](int repetition) { return test_ids(depth + n, uint64_t(1 + 100 * repetition)); };
          // The latent cache is read at the mean position of the run.
          const double position = double(depth) + double(n) / 2;
          const auto [reread, mixer_bytes] = reread_at(position);
          std::optional<DecodeBound> bound;
          if (reads)
            bound = DecodeBound::of(reread, routed_bytes, mixer_bytes, mixer_flops_per_token(config, position),
                                    reads->measure(int64_t(reread), config.moe.num_experts_per_tok), dram_bandwidth,
                                    peak_flops);
          emit(fmt::format("tg{}{}", n, at),
               timed(double(n), [&] { state.copy_from(at_depth); },
                                 [&](int repetition) {
                                   const std::vector<int32_t> tokens = ids(repetition);
                                   for (size_t i = size_t(depth); i < tokens.size(); ++i)
                                     feed(*model, {tokens[i]}, state, 1, precision);
                                 }),
               bound ? &*bound : nullptr);
        }
      }
      // An image's prefill, alone in its sequence: the tower's patches/s (its share of each forward)
      // and the image tokens/s of the whole forward.
      if (image) {
        ModelInput in;
        in.image_pad_id = 0;
        in.ids.assign(size_t(image_tokens), in.image_pad_id);
        in.tokens = TokenBatch::uniform(1, image_tokens);
        in.images = {*image};
        std::vector<double> tower_rates;
        const Stat whole = timed(double(image_tokens), [] {}, [&](int repetition) {
          model->forward(in, {.precision = precision});
          if (repetition > 0) tower_rates.push_back(double(image_patches) / model->timings().vision);
        });
        Stat tower;
        for (double r : tower_rates) tower.mean += r / double(tower_rates.size());
        for (double r : tower_rates)
          tower.std += (r - tower.mean) * (r - tower.mean) / std::max(1.0, double(tower_rates.size()) - 1);
        tower.std = std::sqrt(tower.std);
        const std::string size = fmt::format("image {}x{}", image->source_width, image->source_height);
        emit(fmt::format("{} tower, patches/s ({} patches)", size, image_patches), tower, nullptr);
        emit(fmt::format("{} prefill ({} tokens)", size, image_tokens), whole, nullptr);
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
          const auto run = [&](int repetition) {
            std::vector<SequenceCache> caches(static_cast<size_t>(B));
            for (int64_t step = 0; step < n; ++step) {
              ModelInput in;
              std::vector<int64_t> ones(static_cast<size_t>(B), 1), offsets;
              for (int64_t b = 0; b < B; ++b) {
                caches[size_t(b)] = states[size_t(b)]->cache();
                offsets.push_back(states[size_t(b)]->length());
                const int64_t at = repetition * 7919 + b * 1009 + step;
                in.ids.push_back(text.empty() ? int32_t((at * 131) % V) : text[size_t(at) % text.size()]);
              }
              in.tokens = TokenBatch::packed(ones, offsets);
              model->forward(in, {.precision = precision}, caches);
              for (int64_t b = 0; b < B; ++b) states[size_t(b)]->cache() = caches[size_t(b)];
            }
          };
          // The weights are read once per step for all B sequences (experts: up to B·k of E).
          emit(fmt::format("tg{} ×{} (aggregate)", n, B), timed(double(n * B), prepare, run), nullptr);
        }
      }
    }
  }
  if (progress) progress->finish();
  if (a.json) fmt::print("{}\n", rows.dump(2));
}

}  // namespace hyla::cli
