// `hyla bench kda`: times the three KDA paths (forward, forward+backward), the decode step, and
// references measured in the same process (a large GEMM for the matmul peak, a streaming read for
// memory bandwidth), so every figure is reported as a ratio to something measured alongside it.
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <ctime>
#include <cmath>
#include <functional>
#include <random>
#include <span>
#include <vector>

#include "bench_model.h"
#include "bench_util.h"
#include "commands.h"
#include "hyla/core/error.h"
#include "hyla/core/random.h"
#include "hyla/core/threads.h"
#include "hyla/dist/expert_serving.h"
#include "hyla/kernels/bandwidth.h"
#include "hyla/kernels/kda.h"
#include "hyla/kernels/matmul.h"
#include "hyla/model/model_files.h"
#include "hyla/model/model.h"
#include "hyla/model/param_count.h"
#include "hyla/plan/flops.h"

namespace hyla::cli {
namespace {

struct KdaBenchArgs {
  int64_t heads = 8, dim = 64, chunk = 64;
  std::vector<int64_t> seqs{2048};
  std::string dtype = "f32";
  std::vector<std::string> paths{"recurrent", "dense", "pairwise"};
  bool json = false;
};

void bench_kda(const KdaBenchArgs& a) {
  const bool bf16 = a.dtype == "bf16";
  const int64_t H = a.heads, D = a.dim;
  const double peak = measure_gemm_peak_gflops(bf16);
  nlohmann::json rows = nlohmann::json::array();
  if (!a.json)
    fmt::print("threads {}  matmul peak ({}, 2048^3 oneDNN, this run) {:.0f} GFLOP/s\n", num_threads(), a.dtype, peak);
  for (int64_t T : a.seqs) {
    HYLA_CHECK(T > 0, "--seq values must be positive, got {}", T);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    // Inputs in Tensors (huge-page backed, as in the model), not std::vector.
    auto buffer = [](int64_t n) { return Tensor::zeros(DType::F32, {n}); };
    const int64_t nk = T * H * D;
    Tensor tq = buffer(nk), tk = buffer(nk), tv = buffer(nk), tg = buffer(nk), tbeta = buffer(T * H), to = buffer(nk),
           tdq = buffer(nk), tdk = buffer(nk), tdv = buffer(nk), tdg = buffer(nk), tdb = buffer(T * H), tdo = buffer(nk);
    std::span<float> q(tq.data<float>(), size_t(nk)), k(tk.data<float>(), size_t(nk)), v(tv.data<float>(), size_t(nk)),
        g(tg.data<float>(), size_t(nk)), beta(tbeta.data<float>(), size_t(T * H)), o(to.data<float>(), size_t(nk)),
        dq(tdq.data<float>(), size_t(nk)), dk(tdk.data<float>(), size_t(nk)), dv(tdv.data<float>(), size_t(nk)),
        dg(tdg.data<float>(), size_t(nk)), db(tdb.data<float>(), size_t(T * H)), d_o(tdo.data<float>(), size_t(nk));
    for (auto* x : {&q, &k}) {
      for (int64_t r = 0; r < T * H; ++r) {
        double norm = 0;
        for (int64_t c = 0; c < D; ++c) norm += std::pow((*x)[size_t(r * D + c)] = normal(rng), 2);
        for (int64_t c = 0; c < D; ++c) (*x)[size_t(r * D + c)] /= float(std::sqrt(norm));
      }
    }
    for (float& x : q) x /= std::sqrt(float(D));
    for (float& x : v) x = normal(rng);
    for (float& x : d_o) x = normal(rng);
    for (float& x : g) x = -5.0f / (1.0f + std::exp(-2.0f * normal(rng)));
    for (float& x : beta) x = 1.0f / (1.0f + std::exp(-normal(rng)));
    const int64_t starts[2] = {0, T};
    const KdaShape shape{H, D, D};
    const KdaInputs in{1, starts, q.data(), k.data(), v.data(), g.data(), beta.data(), nullptr};
    Workspace ws;
    KdaSavedStates saved;
    for (KdaPath path : {KdaPath::Recurrent, KdaPath::ChunkedDense, KdaPath::ChunkedPairwise}) {
      if (std::find(a.paths.begin(), a.paths.end(), to_string(path)) == a.paths.end()) continue;
      KdaOptions opt;
      opt.path = path;
      opt.chunk_size = a.chunk;
      opt.bf16_matmul = bf16 && path != KdaPath::Recurrent;
      const double fwd = best_seconds([&] { kda_forward(shape, in, opt, o.data(), nullptr, nullptr, ws); });
      const double fwdbwd = best_seconds([&] {
        kda_forward(shape, in, opt, o.data(), nullptr, &saved, ws);
        kda_backward(shape, in, opt, d_o.data(), nullptr, saved,
                     {dq.data(), dk.data(), dv.data(), dg.data(), db.data(), nullptr}, ws);
      });
      const double flops = double(H) * kda_forward_flops(path, T, D, D, a.chunk);
      const double gflops = flops / fwd * 1e-9;
      rows.push_back({{"path", to_string(path)}, {"heads", H}, {"dim", D}, {"seq", T}, {"dtype", a.dtype},
                      {"fwd_ms", fwd * 1e3}, {"fwdbwd_ms", fwdbwd * 1e3}, {"gflops", gflops},
                      {"fraction_of_matmul_peak", gflops / peak}});
      if (!a.json)
        fmt::print("{:<10} H={:<3} D={:<4} T={:<6} {:<5} fwd {:9.2f} ms  fwd+bwd {:9.2f} ms  {:7.1f} GFLOP/s ({:.0f}% of peak)\n",
                   to_string(path), H, D, T, a.dtype, fwd * 1e3, fwdbwd * 1e3, gflops, 100 * gflops / peak);
    }
  }
  // One decode step for one sequence: every state read and written once. "Hot": the same states
  // every step (they stay in cache). "Cold": steps rotate over copies of the states filling 256 MB,
  // as a model's many layers and sequences do, so each step streams its states from memory.
  const int64_t state_floats = H * D * D, copies = std::max<int64_t>(1, (int64_t(64) << 20) / state_floats);
  Tensor cold = Tensor::zeros(DType::F32, {copies, state_floats});
  std::vector<float> x(size_t(H * D), 0.1f), gx(size_t(H * D), -0.1f), bx(size_t(H), 0.5f), ox(size_t(H * D));
  auto decode_seconds = [&](int64_t rotate) {
    int64_t next = 0;
    return best_seconds([&] {
      for (int i = 0; i < 100; ++i, next = (next + 1) % rotate) {
        float* state = cold.data<float>() + next * state_floats;
        kda_decode_step({H, D, D}, 1, x.data(), x.data(), x.data(), gx.data(), bx.data(), &state, ox.data());
      }
    }, 3, 0.3) / 100;
  };
  const double hot = decode_seconds(1), cold_step = decode_seconds(copies);
  const double bytes = 2.0 * double(state_floats) * 4;
  const double bandwidth = measure_read_bandwidth_gbs();
  if (a.json) {
    rows.push_back({{"path", "decode_step"}, {"heads", H}, {"dim", D}, {"step_us_hot", hot * 1e6},
                    {"step_us_cold", cold_step * 1e6}, {"state_gbs_cold", bytes / cold_step * 1e-9},
                    {"memory_read_gbs", bandwidth}, {"matmul_peak_gflops", peak}});
    fmt::print("{}\n", rows.dump(2));
  } else {
    fmt::print("decode step H={} D={} ({:.0f} KB of states): hot {:.2f} us; cold {:.2f} us = {:.1f} GB/s read+write, "
               "{:.0f}% of the memory read bandwidth measured in this run ({:.1f} GB/s)\n",
               H, D, bytes / 2 / 1024, hot * 1e6, cold_step * 1e6, bytes / cold_step * 1e-9,
               100 * bytes / cold_step * 1e-9 / bandwidth, bandwidth);
  }
}

struct TrainBenchArgs {
  std::string config = "configs/small.json";
  std::vector<std::string> shapes{"8x512", "2x2048"};
  std::string dtype = "bf16";
  int64_t steps = 3;
  bool json = false;
};

// Forward+backward of the whole model on random tokens: tokens/s, the time split by part, and
// model FLOP utilisation against the bf16 GEMM peak measured in this run.
void bench_train(const TrainBenchArgs& a) {
  const ModelConfig config = model_config_of(a.config);
  const Precision precision = a.dtype == "bf16" ? Precision::BF16 : Precision::F32;
  const double peak = measure_gemm_peak_gflops(true);
  Model model(config);
  model.initialize(1);
  const ParamCounts counts = count_parameters(config);
  nlohmann::json rows = nlohmann::json::array();
  if (!a.json)
    fmt::print("{} ({} params, {} active), {} matmuls, threads {}, bf16 GEMM peak this run {:.0f} GFLOP/s\n", a.config,
               counts.total_sum(), counts.active_sum(), a.dtype, num_threads(), peak);
  for (const std::string& shape : a.shapes) {
    int64_t B = 0, T = 0;
    HYLA_CHECK(std::sscanf(shape.c_str(), "%ldx%ld", &B, &T) == 2 && B > 0 && T > 0,
               "--shapes entries look like 8x512, got '{}'", shape);
    ModelInput in;
    in.tokens = TokenBatch::uniform(B, T);
    Rng rng(7);
    for (int64_t r = 0; r < B * T; ++r) in.ids.push_back(int32_t(rng.below(uint64_t(config.vocab_size))));
    for (int64_t r = 0; r < B * T; ++r) in.targets.push_back(int32_t(rng.below(uint64_t(config.vocab_size))));
    model.params().zero_grads();
    model.forward(in, {.precision = precision, .outputs = Outputs::None, .backward = true});  // warm-up: buffers, primitives
    ModelTimings sum;
    double best = 1e30;
    for (int64_t s = 0; s < a.steps; ++s) {
      model.forward(in, {.precision = precision, .outputs = Outputs::None, .backward = true});
      const ModelTimings& t = model.timings();
      sum.kda += t.kda, sum.attention += t.attention, sum.ffn += t.ffn, sum.total += t.total;
      best = std::min(best, t.total);
    }
    const double tokens_per_s = double(B * T) / best;
    const double flops = 3.0 * token_flops(config, counts, T).prefill();  // forward + backward (2×)
    const double mfu = tokens_per_s * flops * 1e-9 / peak;
    rows.push_back({{"shape", shape}, {"tokens_per_s", tokens_per_s}, {"step_ms", best * 1e3}, {"mfu", mfu},
                    {"kda_share", sum.kda / sum.total}, {"attention_share", sum.attention / sum.total},
                    {"ffn_share", sum.ffn / sum.total}, {"rest_share", sum.rest() / sum.total},
                    {"flops_per_token", flops}, {"peak_gflops", peak}});
    if (!a.json)
      fmt::print("{:>8}: {:8.0f} tokens/s  {:8.1f} ms/step  MFU {:5.1f}%   time: kda {:4.1f}%  attention {:4.1f}%  "
                 "ffn/moe {:4.1f}%  rest {:4.1f}%   ({:.0f} MFLOP/token)\n",
                 shape, tokens_per_s, best * 1e3, 100 * mfu, 100 * sum.kda / sum.total,
                 100 * sum.attention / sum.total, 100 * sum.ffn / sum.total, 100 * sum.rest() / sum.total, flops * 1e-6);
  }
  if (a.json) fmt::print("{}\n", rows.dump(2));
}

}  // namespace

void add_bench(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmarks: `bench --model DIR` (inference, like llama-bench), `bench kda`, `bench train`");
  bench->require_subcommand(0, 1);
  static ModelBenchArgs model_args;
  bench->add_option("-m,--model", model_args.model_dir, "Model directory or GGUF file to time prefill and decode of")->check(CLI::ExistingPath);
  bench->add_option("-p,--n-prompt", model_args.prompts, "Prompt lengths (ppN), comma separated")->delimiter(',');
  bench->add_option("-n,--n-gen", model_args.generations, "Generated tokens (tgN), comma separated")->delimiter(',');
  bench->add_option("-d,--n-depth", model_args.depths, "Tokens already in the context, comma separated")->delimiter(',');
  bench->add_option("-t,--threads", model_args.threads, "Thread counts, comma separated (default: --threads)")->delimiter(',');
  bench->add_option("-b,--batch", model_args.batches, "Sequences decoded together (tgN ×B rows), comma separated")->delimiter(',');
  bench->add_option("-r,--repetitions", model_args.reps, "Timed repetitions per test")->check(CLI::Range(1, 1000));
  bench->add_option("--dtype", model_args.dtypes, "Matmul inputs, comma separated")->delimiter(',')->check(CLI::IsMember({"f32", "bf16"}));
  bench->add_option("--prefill-chunk", model_args.prefill_chunk, "Prompt tokens per forward")->check(positive());
  bench->add_option("--ttft-prefix", model_args.ttft_prefix, "Also time the first token after this many shared prompt tokens, cold and cached")->check(non_negative());
  bench->add_option("--snapshot-every", model_args.snapshot_every, "With --ttft-prefix: the prompt-state snapshot interval")->check(positive());
  bench->add_flag("--json", model_args.json, "Print a JSON list of rows");
  bench->add_option("--text", model_args.text_file, "Take the test tokens from this text instead of random ids")
      ->check(CLI::ExistingFile);
  bench->add_option("--image", model_args.image_file,
                    "Also time an image's prefill: patches/s through the vision tower, tokens/s through the model")
      ->check(CLI::ExistingFile);
  static ExpertMemoryArgs expert_memory;
  static std::filesystem::path mmproj;
  add_expert_memory_options(bench, expert_memory);
  add_mmproj_option(bench, mmproj);
  bench->add_flag("--cold-page-cache", model_args.cold_page_cache,
                  "With --expert-memory: start every repetition with no expert resident and the experts' file pages "
                  "dropped from the page cache");
  bench->callback([bench] {
    if (!bench->get_subcommands().empty()) return;
    HYLA_CHECK(!model_args.model_dir.empty(), "bench: give --model DIR, or a subcommand (kda, train)");
    if (serve_experts_to_rank0(model_args.model_dir)) return;
    model_args.load = expert_memory.load_options();
    model_args.load.mmproj = mmproj;
    model_args.load.bf16_matrices = std::all_of(model_args.dtypes.begin(), model_args.dtypes.end(),
                                                [](const std::string& d) { return d == "bf16"; });
    bench_model(model_args);
  });
  auto* kda = bench->add_subcommand("kda", "Time the KDA paths (recurrent, chunked dense, chunked pairwise)");
  static KdaBenchArgs args;
  kda->add_option("--heads", args.heads, "Heads")->check(CLI::Range(1, 1024));
  kda->add_option("--dim", args.dim, "Key and value head dim")->check(CLI::Range(1, 1024));
  kda->add_option("--seq", args.seqs, "Sequence lengths, comma separated")->delimiter(',');
  kda->add_option("--chunk", args.chunk, "Chunk size (multiple of 16)");
  kda->add_option("--dtype", args.dtype, "Matmul inputs of the chunked paths")->check(CLI::IsMember({"f32", "bf16"}));
  kda->add_option("--path", args.paths, "Paths to time, comma separated")
      ->delimiter(',')
      ->check(CLI::IsMember({"recurrent", "dense", "pairwise"}));
  kda->add_flag("--json", args.json, "Print a JSON list of rows");
  kda->add_option_function<std::string>(
         "--clock", [](const std::string& c) { use_cpu_clock = c == "cpu"; },
         "wall (default) or cpu: process CPU time per thread, robust to other load on a shared machine")
      ->check(CLI::IsMember({"wall", "cpu"}));
  kda->callback([] { bench_kda(args); });

  auto* train = bench->add_subcommand("train", "Time forward+backward of a model config (tokens/s, split, MFU)");
  static TrainBenchArgs train_args;
  train->add_option("--config", train_args.config, "Model config.json")->check(CLI::ExistingFile);
  train->add_option("--shapes", train_args.shapes, "Batch shapes BxT, comma separated")->delimiter(',');
  train->add_option("--dtype", train_args.dtype, "Matmul inputs")->check(CLI::IsMember({"f32", "bf16"}));
  train->add_option("--steps", train_args.steps, "Timed steps per shape (best is reported)")->check(CLI::Range(1, 1000));
  train->add_flag("--json", train_args.json, "Print a JSON list of rows");
  train->callback([] { bench_train(train_args); });
}

}  // namespace hyla::cli
