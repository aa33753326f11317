#include "hyla/train/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>

#include "hyla/core/clock.h"
#include "hyla/core/error.h"
#include "hyla/core/threads.h"
#include "hyla/data/image_batches.h"
#include "hyla/data/loader.h"
#include "hyla/data/token_shard.h"
#include "hyla/data/tokenizer.h"
#include "hyla/dist/expert_parallel.h"
#include "hyla/dist/processes.h"
#include "hyla/eval/next_token_input.h"
#include "hyla/eval/perplexity.h"
#include "hyla/infer/scheduler.h"
#include "hyla/io/file.h"
#include "hyla/io/json_fields.h"
#include "hyla/kernels/matmul.h"
#include "hyla/model/model.h"
#include "hyla/model/param_count.h"
#include "hyla/plan/flops.h"
#include "hyla/train/checkpoint.h"
#include "hyla/train/agent_mix.h"
#include "hyla/train/longctx_mix.h"
#include "hyla/train/gradient_reducer.h"
#include "hyla/train/optimizer.h"
#include "hyla/train/schedule.h"
#include "hyla/train/train_step.h"

namespace hyla {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Timed 2048³ GEMMs behind the MFU reference: 0.1–0.25 s each on two cores, quiet or shared.
constexpr int kPeakRepetitions = 5;

std::string clock_text(double seconds) {
  const int64_t s = std::llround(seconds);
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, s % 3600 / 60);
}

// Keeps the metrics lines of steps up to `step` (the checkpoint a resumed run continues from).
// −Σ p ln p over the token frequencies of the training split: the loss of a model that ignores
// context, the line a trained model must get well below.
double unigram_entropy(const fs::path& data_dir) {
  const json meta = parse_json_file((data_dir / "meta.json").string());
  std::vector<uint64_t> counts;
  uint64_t total = 0;
  std::vector<int32_t> block(size_t(1) << 16);
  for (const auto& name : meta.at("splits").at("train").at("shards")) {
    const TokenShard shard(data_dir / name.get<std::string>());
    counts.resize(std::max(counts.size(), size_t(shard.vocab_size())), 0);
    for (uint64_t at = 0; at < shard.size(); at += block.size()) {
      const size_t n = size_t(std::min<uint64_t>(block.size(), shard.size() - at));
      shard.read(at, std::span<int32_t>(block.data(), n));
      for (size_t i = 0; i < n; ++i) ++counts[size_t(block[i])];
      total += n;
    }
  }
  double h = 0;
  for (uint64_t c : counts)
    if (c) h -= double(c) / double(total) * std::log(double(c) / double(total));
  return h;
}

// --seq, --batch, --lr and --steps over the training config.
void apply_command_line(const TrainOptions& o, TrainConfig& tc) {
  if (o.seq > 0) {
    const int64_t sequences = o.batch > 0 ? o.batch : std::max<int64_t>(1, tc.curriculum.front().batch_tokens / o.seq);
    int64_t tokens = 0;
    for (const CurriculumStage& s : tc.curriculum) tokens += s.tokens;
    tc.curriculum = {CurriculumStage{o.seq, tokens, sequences * o.seq, 1.0}};
  } else if (o.batch > 0) {
    for (CurriculumStage& s : tc.curriculum) s.batch_tokens = o.batch * s.seq_len;
  }
  if (o.lr > 0) tc.lr = o.lr;
  if (o.steps > 0) {  // scale every stage's tokens so that the curriculum spans exactly `steps`
    const int64_t total = tc.total_steps();
    int64_t assigned = 0;
    for (size_t i = 0; i < tc.curriculum.size(); ++i) {
      CurriculumStage& s = tc.curriculum[i];
      const int64_t steps = i + 1 == tc.curriculum.size()
                                ? o.steps - assigned
                                : std::max<int64_t>(1, int64_t(std::llround(double(s.steps()) * double(o.steps) / double(total))));
      s.tokens = std::max<int64_t>(1, steps) * s.batch_tokens;
      assigned += s.steps();
    }
  }
}

// Rows [rank·B/N, (rank+1)·B/N) of a batch: a process's share of the batch every process draws alike.
void keep_rows_of(TokenWindows& windows, int rank, int ranks) {
  const int64_t first = windows.rows * rank / ranks, end = windows.rows * (rank + 1) / ranks;
  windows.tokens.erase(windows.tokens.begin() + end * windows.width, windows.tokens.end());
  windows.tokens.erase(windows.tokens.begin(), windows.tokens.begin() + first * windows.width);
  windows.lengths.erase(windows.lengths.begin() + end, windows.lengths.end());
  windows.lengths.erase(windows.lengths.begin(), windows.lengths.begin() + first);
  windows.rows = end - first;
}

}  // namespace

void run_training(const TrainOptions& o) {
  // Data parallel under mpirun: every process draws the same batches and trains on its share of
  // the rows; rank 0 alone prints, writes metrics, evaluates, samples and saves the model.
  Collective& world = processes();
  const bool lead = world.rank() == 0;
  const int ranks = world.size();
  if (o.deterministic) set_threads(1);
  const fs::path run_dir = o.run_dir, data_dir = o.data_dir;
  const ModelConfig config = ModelConfig::load(o.model_config);
  TrainConfig tc = TrainConfig::load(o.train_config);
  apply_command_line(o, tc);
  tc.validate("train config after command-line overrides");
  HYLA_CHECK(fs::exists(data_dir / "meta.json"), "{}: not a prepared data directory (no meta.json)", data_dir.string());
  const fs::path tokenizer_file = data_dir / "tokenizer.json";
  const Tokenizer tokenizer = Tokenizer::load(tokenizer_file);
  HYLA_CHECK(tokenizer.vocab_size() <= config.vocab_size, "{}: the tokenizer has {} tokens but vocab_size is {}",
             o.model_config, tokenizer.vocab_size(), config.vocab_size);

  HYLA_CHECK((tc.image_ratio > 0) == !o.images_dirs.empty(),
             "{}: images.ratio {} {}", o.train_config, tc.image_ratio,
             o.images_dirs.empty() ? "needs image records: pass --images DIR" : "is 0, so --images would be unused");
  HYLA_CHECK(tc.image_weights.empty() || tc.image_weights.size() == o.images_dirs.size(),
             "{}: images.weights has {} weights but {} --images directories were given (one weight each, in order)",
             o.train_config, tc.image_weights.size(), o.images_dirs.size());
  HYLA_CHECK(tc.image_augment.empty() || tc.image_augment.size() == o.images_dirs.size(),
             "{}: images.augment has {} entries but {} --images directories were given (one each, in order; {{}} for none)",
             o.train_config, tc.image_augment.size(), o.images_dirs.size());
  HYLA_CHECK(o.images_dirs.empty() || ranks == 1, "hyla train --images does not run under mpirun yet (one process)");
  HYLA_CHECK(tc.agent_ratio == 0 || ranks == 1, "{}: agent demonstrations do not run under mpirun yet (one process)", o.train_config);
  HYLA_CHECK(tc.longctx_ratio == 0 || ranks == 1, "{}: longctx does not run under mpirun yet (one process)", o.train_config);
  const int64_t G = tc.expert_parallel;
  HYLA_CHECK(G == 1 || (ranks % G == 0 && config.moe.num_experts >= G),
             "{}: distributed.expert_parallel {} needs a process count that it divides (not {}) and at most "
             "moe.num_experts ({}) experts",
             o.train_config, G, ranks, config.moe.num_experts);
  for (const CurriculumStage& s : tc.curriculum)
    HYLA_CHECK(s.sequences() / tc.grad_accum % ranks == 0,
               "{}: a micro-batch of {} sequences (seq_len {}) does not split over {} processes; choose a batch that "
               "is a multiple of {} per micro-batch (--batch)",
               o.train_config, s.sequences() / tc.grad_accum, s.seq_len, ranks, ranks);

  if (lead) prepare_run_directory(run_dir, o.resume, o.overwrite);
  world.barrier();  // the run directory is in order before any process reads it
  // Expert parallelism: groups of G consecutive ranks, each process holding 1/G of every MoE
  // layer's routed experts; an expert's replicas (one per group) sum its gradients.
  std::unique_ptr<Collective> expert_group, expert_replicas;
  std::function<bool(const Param&)> holds;
  if (G > 1) {
    expert_group = world.split(world.rank() / int(G));
    expert_replicas = world.split(world.rank() % int(G));
    const auto [first, last] = expert_range(config.moe.num_experts, expert_group->rank(), int(G));
    holds = holds_experts(first, last);
  }
  const ProcessLayout layout{world, G};
  // Rank 0 evaluates and samples alone, unless its forwards need its expert group's processes.
  const bool evaluates = lead || G > 1;
  Model model(config, /*allocate=*/false);
  if (holds) model.params().hold_only(holds);
  model.params().allocate();
  std::vector<const ExpertParallelExchange*> exchanges;  // the model's, for the traffic counters
  if (G > 1) {
    std::vector<std::unique_ptr<ExpertExchange>> owned;
    for (size_t i = 0; i < model.moe_layers().size(); ++i) {
      auto exchange = std::make_unique<ExpertParallelExchange>(*expert_group);
      exchanges.push_back(exchange.get());
      owned.push_back(std::move(exchange));
    }
    model.own_expert_exchanges(std::move(owned));
  }
  GradientReducer reducer(model.params(), world, expert_replicas.get(), tc.zero_stage == 1, tc.bucket_mb);
  AdamW optimizer(model.params(), tc, reducer.shard());
  const int64_t total_steps = tc.total_steps();
  int64_t step = 0, bad_steps = 0;
  json loader_state, images_state, longctx_state, agent_state;
  if (o.resume) {
    const auto checkpoint = latest_checkpoint(run_dir);
    HYLA_CHECK(checkpoint.has_value(), "{}: --resume but no checkpoint", run_dir.string());
    auto saved = Model::load(checkpoint->dir / "model", {.holds = holds});
    HYLA_CHECK(saved->params().numel() == model.params().numel(), "{}: the checkpoint's model differs from {}",
               checkpoint->dir.string(), o.model_config);
    std::memcpy(model.params().values(), saved->params().values(), size_t(model.params().numel()) * 4);
    model.params().refresh_bf16();
    optimizer.load(optimizer_files(*checkpoint));
    const json state = load_trainer_state(*checkpoint);
    step = state.at("step").get<int64_t>();
    bad_steps = state.at("bad_steps").get<int64_t>();
    loader_state = state.at("loader");
    images_state = state.value("images", json());
    longctx_state = state.value("longctx", json());
    agent_state = state.value("agent", json());
    if (lead) {
      truncate_metrics(run_dir / "metrics.jsonl", step);
      fmt::print("resumed from {} (step {})\n", checkpoint->dir.string(), step);
    }
  } else if (!o.init_dir.empty()) {
    auto init = Model::load(o.init_dir, {.holds = holds});
    HYLA_CHECK(init->config().to_json() == config.to_json(), "--init {}: its config.json differs from {}", o.init_dir,
               o.model_config);
    std::memcpy(model.params().values(), init->params().values(), size_t(model.params().numel()) * 4);
    model.params().refresh_bf16();
    if (lead) fmt::print("initialised from {}\n", o.init_dir);
  } else {
    model.initialize(tc.seed);
  }
  if (!o.resume && lead) {
    const double entropy = unigram_entropy(data_dir);
    fmt::print("data {}: unigram entropy {:.4f} nats per token (a context-free model's loss)\n", data_dir.string(), entropy);
    write_file_atomic(run_dir / "run.json", json{{"model", config.to_json()},
                                                 {"train", tc.to_json()},
                                                 {"data", fs::absolute(data_dir).string()},
                                                 {"processes", ranks},
                                                 {"unigram_entropy", entropy}}
                                                    .dump(2) + "\n");
    write_file_atomic(run_dir / "metrics.jsonl", "");
  }

  const ParamCounts counts = count_parameters(config);
  const bool bf16 = tc.precision == Precision::BF16;
  // Timed in CPU time: on a shared machine the wall-clock peak drops with the other load and MFU
  // against it reads high; CPU time keeps the reference at what the cores do while they run.
  const double peak = measure_gemm_peak_gflops(bf16, kPeakRepetitions, PeakClock::ProcessCpu);
  if (lead) {
    fmt::print("model {} ({:.1f}M params, {:.1f}M active), {} steps, {} matmuls, {} threads\n", o.model_config,
               counts.total_sum() * 1e-6, counts.active_sum() * 1e-6, total_steps, bf16 ? "bf16" : "f32", num_threads());
    fmt::print("MFU is relative to {:.0f} GFLOP/s{}: the best of {} {} oneDNN 2048^3 GEMMs at start-up, timed in CPU time "
               "per thread (other load on the machine lowers MFU, not this reference)\n",
               peak, ranks > 1 ? fmt::format(" per process, x {} processes", ranks) : "", kPeakRepetitions,
               bf16 ? "bf16" : "f32");
  }
  if (lead && ranks > 1)
    fmt::print("data parallel over {} processes: each takes 1/{} of every micro-batch; gradients {} in {:g} MB buckets "
               "during the backward{}{}\n",
               ranks, ranks, reducer.sharded() ? "reduce-scattered" : "all-reduced", tc.bucket_mb,
               reducer.sharded() ? ", optimiser state sharded (ZeRO-1), weights all-gathered" : "",
               G > 1 ? fmt::format("; expert parallel in groups of {} (each process holds {} of {} routed experts per "
                                   "layer; dispatch and combine by all-to-all)",
                                   G, config.moe.num_experts / G, config.moe.num_experts)
                     : "");

  // The ETA is the model FLOPs still to do over the rate this process has done them at, in wall
  // time with evaluations, samples and checkpoints included. Every stage of a curriculum may take
  // the same tokens per step, but longer sequences cost more attention FLOPs per token, so
  // remaining steps times the mean step time so far would promise the longer stages too soon. The
  // rate itself may differ between stages; the ETA corrects itself as each one runs. Long-context
  // rows run at the stage's length and can outnumber the text rows many times over, so they count;
  // image and agent rows, shorter and of their own lengths, do not.
  // Long-context rows a micro-batch of `text_rows` text rows carries at a stage (0 without longctx).
  auto longctx_rows = [&](int64_t stage_index, double text_rows) -> int64_t {
    const double ratio = tc.longctx_ratio > 0 ? tc.longctx_ratio_of(stage_index) : 0.0;
    return ratio > 0 ? std::max<int64_t>(1, std::llround(ratio * text_rows)) : 0;
  };
  auto step_flops = [&](int64_t stage_index) {
    const CurriculumStage& s = tc.curriculum[size_t(stage_index)];
    const double text_rows = double(s.sequences() / tc.grad_accum);
    return 3.0 * token_flops(config, counts, s.seq_len).prefill() * double(s.batch_tokens) *
           (1.0 + double(longctx_rows(stage_index, text_rows)) / text_rows);
  };
  double flops_left = 0, flops_done = 0;
  for (int64_t i = 0; i < int64_t(tc.curriculum.size()); ++i) {
    const CurriculumStage& s = tc.curriculum[size_t(i)];
    const int64_t steps_left = tc.stage_start(i) + s.steps() - std::max(step, tc.stage_start(i));
    if (steps_left > 0) flops_left += double(steps_left) * step_flops(i);
  }
  const auto loop_start = std::chrono::steady_clock::now();

  int64_t stage = tc.stage_of(step);
  auto micro_batch = [&](int64_t s) { return tc.curriculum[size_t(s)].sequences() / tc.grad_accum; };
  // A resumed loader starts in its saved shape (the checkpoint may sit at a stage's last step); the
  // stage announcement below then moves it to the current stage's, as the uninterrupted run did.
  const int64_t loader_batch = loader_state.is_null() ? micro_batch(stage) : loader_state.at("batch_size").get<int64_t>();
  const int64_t loader_seq =
      loader_state.is_null() ? tc.curriculum[size_t(stage)].seq_len : loader_state.at("seq_len").get<int64_t>();
  TokenLoader loader = TokenLoader::from_directory(data_dir, "train", loader_batch, loader_seq, LoaderMode::Random, tc.seed);
  if (!loader_state.is_null()) loader.set_state(loader_state);
  std::optional<ImageRecordSampler> images;
  ImageSequences image_sequences;
  if (!o.images_dirs.empty()) {
    images.emplace(std::vector<fs::path>(o.images_dirs.begin(), o.images_dirs.end()), "train", tokenizer, config.vision,
                   tc.seed + 1, tc.image_weights, tc.image_augment);
    if (!images_state.is_null()) images->set_state(images_state);
    fmt::print("images {}: {} training records, {:g} image rows per text row{}\n", fmt::join(o.images_dirs, ", "),
               images->size(), tc.image_ratio,
               tc.image_weights.empty() ? "" : fmt::format(", directories weighted {}", fmt::join(tc.image_weights, ":")));
    for (size_t i = 0; i < tc.image_augment.size(); ++i)
      if (tc.image_augment[i].any())
        fmt::print("images {}: augmented (mirror with probability {:g}, shifts up to {} pixels)\n", o.images_dirs[i],
                   tc.image_augment[i].flip, tc.image_augment[i].shift);
  }
  std::optional<AgentDemoSampler> agent;
  ImageSequences agent_sequences;
  if (tc.agent_ratio > 0) {
    agent.emplace(tc.agent_environments, tc.agent_fault_share, tokenizer, tc.seed);
    if (!agent_state.is_null()) agent->set_state(agent_state);
    fmt::print("agent demonstrations: {} (faults in {:g} of calls), {:g} rows per text row, loss on assistant turns\n",
               fmt::join(tc.agent_environments, ", "), tc.agent_fault_share, tc.agent_ratio);
  }
  std::optional<LongCtxSampler> longctx;
  ImageSequences longctx_sequences;
  if (tc.longctx_ratio > 0) {
    longctx.emplace(tc.longctx_tasks, tc.longctx_haystack, tokenizer, tc.seed);
    if (!longctx_state.is_null()) longctx->set_state(longctx_state);
    fmt::print("longctx: {} ({}), {:g} rows per text row where a stage sets none, one sample per stage length\n",
               fmt::join(tc.longctx_tasks, ", "), tc.longctx_haystack, tc.longctx_ratio);
  }
  auto trainer_state = [&] {
    json state = {{"step", step}, {"bad_steps", bad_steps}, {"loader", loader.state()}};
    if (images) state["images"] = images->state();
    if (longctx) state["longctx"] = longctx->state();
    if (agent) state["agent"] = agent->state();
    return state;
  };
  std::ofstream metrics;
  if (lead) metrics.open(run_dir / "metrics.jsonl", std::ios::app);
  int64_t announced_stage = -1;
  TokenWindows windows;

  while (step < total_steps) {
    stage = tc.stage_of(step);
    const CurriculumStage& st = tc.curriculum[size_t(stage)];
    if (stage != announced_stage) {
      loader.set_batch_size(micro_batch(stage));
      loader.set_seq_len(st.seq_len);
      if (lead) fmt::print("stage {}/{}: seq_len {}, {} sequences per step ({} tokens), lr x{}, steps {}..{}{}\n", stage + 1,
                 tc.curriculum.size(), st.seq_len, st.sequences(), st.batch_tokens, st.lr_scale, tc.stage_start(stage) + 1,
                 tc.stage_start(stage) + st.steps(),
                 longctx ? fmt::format(", longctx {:g} rows per text row of {}", tc.longctx_ratio_of(stage),
                                       fmt::join(tc.longctx_tasks_of(stage), ", "))
                         : "");
      announced_stage = stage;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const double lr = learning_rate(tc, step);
    const ReductionTraffic traffic_before = reducer.traffic();
    const auto exchanged = [&] {
      std::pair<int64_t, double> total{0, 0.0};
      for (const auto& x : exchanges) total.first += x->bytes_sent(), total.second += x->seconds();
      return total;
    };
    const auto exchanged_before = exchanged();
    const double busy_before = world.busy_seconds();
    const int64_t bytes_before = world.bytes();
    const StepResult r = train_step(
        model, optimizer, tc, lr,
        [&](int64_t) {
          loader.next(windows);
          if (ranks > 1) keep_rows_of(windows, world.rank(), ranks);
          ModelInput in = next_token_input(windows);
          const double text_rows = double(in.ids.size());
          if (images) {
            images->next(std::max<int64_t>(1, std::llround(tc.image_ratio * text_rows)), image_sequences);
            append_image_sequences(in, image_sequences, tokenizer.special_id("<|image_pad|>"));
          }
          if (const int64_t rows = longctx_rows(stage, text_rows); rows > 0) {
            longctx->next(rows, st.seq_len, tc.longctx_tasks_of(stage), longctx_sequences);
            append_image_sequences(in, longctx_sequences, in.image_pad_id);
          }
          if (agent) {
            agent->next(std::max<int64_t>(1, std::llround(tc.agent_ratio * text_rows)), agent_sequences);
            append_image_sequences(in, agent_sequences, in.image_pad_id);
          }
          return in;
        },
        reducer);
    const double loss = r.loss, grad_norm = r.grad_norm;
    const int64_t tokens = r.tokens;
    json row{{"step", step + 1}, {"stage", stage + 1}, {"seq_len", st.seq_len}, {"loss", loss}, {"lr", lr},
             {"grad_norm", grad_norm}, {"tokens", tokens}};
    if (r.aux_loss != 0) row["aux_loss"] = r.aux_loss;
    if (r.skipped) {
      ++bad_steps;
      if (lead) fmt::print(stderr, "warning: step {}: non-finite {} (loss {}, grad norm {}); step skipped ({} in a row)\n", step + 1,
                 std::isfinite(loss) ? "gradient" : "loss", loss, grad_norm, bad_steps);
      HYLA_CHECK(bad_steps < tc.max_bad_steps, "training stopped at step {}: {} non-finite steps in a row", step + 1,
                 bad_steps);
      row["skipped"] = true;
      row["loss"] = nullptr;
      row["grad_norm"] = nullptr;
    } else {
      bad_steps = 0;
    }
    const double seconds = seconds_since(t0);
    const double tokens_per_s = double(tokens) / seconds;
    const double mfu = tokens_per_s * 3.0 * token_flops(config, counts, st.seq_len).prefill() * 1e-9 / (peak * ranks);
    row["step_ms"] = seconds * 1e3;
    row["tokens_per_s"] = tokens_per_s;
    row["mfu"] = mfu;
    row["peak_gflops"] = peak * ranks;
    if (ranks > 1) {
      const ReductionTraffic& t = reducer.traffic();
      const int64_t gradient_bytes = t.all_reduce_bytes + t.reduce_scatter_bytes + t.all_gather_bytes -
                                     traffic_before.all_reduce_bytes - traffic_before.reduce_scatter_bytes -
                                     traffic_before.all_gather_bytes;
      const auto exchanged_after = exchanged();
      row["comm"] = {{"processes", ranks},
                     {"all_reduce_bytes", t.all_reduce_bytes - traffic_before.all_reduce_bytes},
                     {"expert_all_reduce_bytes", t.expert_all_reduce_bytes - traffic_before.expert_all_reduce_bytes},
                     {"all_to_all_bytes", exchanged_after.first - exchanged_before.first},
                     {"all_to_all_ms", (exchanged_after.second - exchanged_before.second) * 1e3},
                     {"reduce_scatter_bytes", t.reduce_scatter_bytes - traffic_before.reduce_scatter_bytes},
                     {"all_gather_bytes", t.all_gather_bytes - traffic_before.all_gather_bytes},
                     {"other_bytes", world.bytes() - bytes_before - gradient_bytes},
                     {"comm_ms", (world.busy_seconds() - busy_before) * 1e3},
                     {"wait_ms", (t.wait_seconds - traffic_before.wait_seconds) * 1e3}};
    }
    json moe = json::array();
    const auto loads = model.load_stats();
    for (size_t i = 0; i < loads.size(); ++i)
      moe.push_back({{"max_over_mean", loads[i].max_over_mean}, {"dead", loads[i].dead_experts}});
    if (!moe.empty()) row["moe"] = moe;
    ++step;
    const double flops = step_flops(stage);
    flops_done += flops;
    flops_left -= flops;

    const bool last = step == total_steps;
    if (evaluates && tc.eval_every > 0 && (step % tc.eval_every == 0 || last)) {
      const PerplexityResult e =
          evaluate_perplexity(model, data_dir, "val", st.seq_len, micro_batch(stage), tc.precision, false, tc.eval_batches);
      row["val_loss"] = e.loss;
      row["val_ppl"] = std::exp(e.loss);
      if (lead) fmt::print("eval step {}: val loss {:.4f}, perplexity {:.2f} ({} tokens)\n", step, e.loss, std::exp(e.loss), e.tokens);
    }
    if (lead) {
      metrics << row.dump() << "\n";
      metrics.flush();
    }
    if (lead && !o.quiet && (step % tc.log_every == 0 || last)) {
      const double elapsed = seconds_since(loop_start);
      fmt::print("step {:>6}/{} | stage {} T={} | loss {:.4f} | lr {:.2e} | grad {:.3f} | {:6.0f} ms | {:6.0f} tok/s | "
                 "MFU {:4.1f}% of {:.0f} GFLOP/s | {} elapsed, eta {}\n",
                 step, total_steps, stage + 1, st.seq_len, row["loss"].is_null() ? NAN : loss, lr,
                 row["grad_norm"].is_null() ? NAN : grad_norm, seconds * 1e3, tokens_per_s, 100 * mfu, peak * ranks,
                 clock_text(elapsed), clock_text(std::max(0.0, flops_left) * elapsed / flops_done));
    }
    if (evaluates && tc.sample_every > 0 && step % tc.sample_every == 0 && !last) {
      GenerationRequest request;
      request.prompt = tokenizer.encode(tc.sample_prompt);
      if (request.prompt.empty()) request.prompt = {tokenizer.special_id("<|endoftext|>")};
      request.max_tokens = tc.sample_tokens;
      request.sampling.temperature = tc.sample_temperature;
      request.sampling.seed = uint64_t(step);
      EngineOptions options;
      options.max_sequences = 1;
      options.context = int64_t(request.prompt.size()) + tc.sample_tokens + 1;
      options.precision = tc.precision;
      options.prefix_cache_bytes = 0;
      Scheduler sampler(model, tokenizer, options);  // on this thread: no worker, no second OpenMP pool
      sampler.add(std::move(request));
      std::vector<Scheduler::Finished> done;
      while (done.empty()) done = sampler.step();
      if (lead) fmt::print("sample step {}: {}{}\n", step, tc.sample_prompt, done.front().output.text);
    }
    if (tc.checkpoint_every > 0 && (step % tc.checkpoint_every == 0 || last)) {
      save_checkpoint(run_dir, step, model, optimizer,
                      trainer_state(), tokenizer_file,
                      tc.keep_checkpoints, layout);
    }
  }
  save_model(run_dir / "model", model, tokenizer_file, layout);
  if (!lead) return;
  fmt::print("done: {} steps, {} in this process; model in {}\n", step, clock_text(seconds_since(loop_start)),
             (run_dir / "model").string());
}

}  // namespace hyla
