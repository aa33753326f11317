#include "hyla/train/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

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
#include "hyla/model/model_files.h"
#include "hyla/model/model.h"
#include "hyla/model/param_count.h"
#include "hyla/plan/flops.h"
#include "hyla/train/checkpoint.h"
#include "hyla/train/gradient_reducer.h"
#include "hyla/train/optimizer.h"
#include "hyla/train/row_source.h"
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
  if (o.lr > 0) tc.optimizer.lr = o.lr;
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

// The checks that need the command line as well as the configs; TRAIN.json's own rules are
// TrainConfig::validate's.
void check_run(const TrainOptions& o, const ModelConfig& config, const TrainConfig& tc, int ranks) {
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
}

// Expert parallelism: groups of G consecutive ranks, each process holding 1/G of every MoE
// layer's routed experts; an expert's replicas (one per group) sum its gradients.
struct ExpertGroups {
  std::unique_ptr<Collective> group, replicas;
  std::function<bool(const Param&)> holds;  // empty: every parameter
  std::vector<const ExpertParallelExchange*> exchanges;  // the model's, for the traffic counters

  ExpertGroups(Collective& world, const ModelConfig& config, int64_t G) {
    if (G == 1) return;
    group = world.split(world.rank() / int(G));
    replicas = world.split(world.rank() % int(G));
    const auto [first, last] = expert_range(config.moe.num_experts, group->rank(), int(G));
    holds = holds_experts(first, last);
  }
  // The model with the parameters this process holds allocated, each MoE layer given its exchange.
  std::unique_ptr<Model> make_model(const ModelConfig& config) {
    auto model = std::make_unique<Model>(config, /*allocate=*/false);
    if (holds) model->params().hold_only(holds);
    model->params().allocate();
    if (!group) return model;
    std::vector<std::unique_ptr<ExpertExchange>> owned;
    for (size_t i = 0; i < model->moe_layers().size(); ++i) {
      auto exchange = std::make_unique<ExpertParallelExchange>(*group);
      exchanges.push_back(exchange.get());
      owned.push_back(std::move(exchange));
    }
    model->own_expert_exchanges(std::move(owned));
    return model;
  }
  std::pair<int64_t, double> exchanged() const {  // bytes sent and seconds, over every layer
    std::pair<int64_t, double> total{0, 0.0};
    for (const auto& x : exchanges) total.first += x->bytes_sent(), total.second += x->seconds();
    return total;
  }
};

// One `hyla train` run. Data parallel under mpirun: every process draws the same batches and trains
// on its share of the rows; rank 0 alone prints, writes metrics, evaluates, samples and saves the model.
class TrainingRun {
 public:
  explicit TrainingRun(const TrainOptions& o);
  void run();

 private:
  void start();  // resumes, initialises from --init, or initialises; writes run.json for a new run; builds the loader
  void print_setup() const;
  void announce(int64_t stage) const;
  ModelInput micro_batch(int64_t stage);
  nlohmann::json communication_since(const ReductionTraffic& before, const std::pair<int64_t, double>& exchanged_before,
                                     double busy_before, int64_t bytes_before) const;
  void count_bad_steps(const StepResult& r);
  nlohmann::json metrics_row(int64_t stage, double lr, const StepResult& r, double seconds) const;
  void print_step(const nlohmann::json& row, const StepResult& r, double elapsed, double eta) const;
  void evaluate(int64_t stage, nlohmann::json& row);
  void sample();
  nlohmann::json trainer_state() const;
  int64_t micro_batch_rows(int64_t stage) const { return tc_.curriculum[size_t(stage)].sequences() / tc_.grad_accum; }
  double step_flops(int64_t stage) const;

  const TrainOptions& o_;
  Collective& world_;
  const bool lead_;
  const int ranks_;
  const fs::path run_dir_, data_dir_, tokenizer_file_;
  const ModelConfig config_;
  const TrainConfig tc_;
  const Tokenizer tokenizer_;
  const ParamCounts counts_;
  ExpertGroups experts_;
  const ProcessLayout layout_;
  // Rank 0 evaluates and samples alone, unless its forwards need its expert group's processes.
  const bool evaluates_;
  std::unique_ptr<Model> model_;
  GradientReducer reducer_;
  AdamW optimizer_;
  std::vector<std::unique_ptr<RowSource>> sources_;
  std::optional<TokenLoader> loader_;
  TokenWindows windows_;
  int64_t step_ = 0, bad_steps_ = 0;
  double peak_gflops_ = 0;
};

// TRAIN.json with the command line's overrides, checked against the model and the processes.
TrainConfig training_config(const TrainOptions& o, const ModelConfig& config, int ranks) {
  TrainConfig tc = TrainConfig::load(o.train_config);
  apply_command_line(o, tc);
  tc.validate("train config after command-line overrides");
  check_run(o, config, tc, ranks);
  return tc;
}

Tokenizer data_tokenizer(const TrainOptions& o, const fs::path& data_dir, const ModelConfig& config) {
  HYLA_CHECK(fs::exists(data_dir / "meta.json"), "{}: not a prepared data directory (no meta.json)", data_dir.string());
  Tokenizer tokenizer = Tokenizer::load(data_dir / "tokenizer.json");
  HYLA_CHECK(tokenizer.vocab_size() <= config.vocab_size, "{}: the tokenizer has {} tokens but vocab_size is {}",
             o.model_config, tokenizer.vocab_size(), config.vocab_size);
  return tokenizer;
}

TrainingRun::TrainingRun(const TrainOptions& o)
    : o_(o),
      world_(processes()),
      lead_(world_.rank() == 0),
      ranks_(world_.size()),
      run_dir_(o.run_dir),
      data_dir_(o.data_dir),
      tokenizer_file_(data_dir_ / "tokenizer.json"),
      config_(model_config_of(o.model_config)),
      tc_(training_config(o, config_, ranks_)),
      tokenizer_(data_tokenizer(o, data_dir_, config_)),
      counts_(count_parameters(config_)),
      experts_(world_, config_, tc_.expert_parallel),
      layout_{world_, tc_.expert_parallel},
      evaluates_(lead_ || tc_.expert_parallel > 1),
      model_(experts_.make_model(config_)),
      reducer_(model_->params(), world_, experts_.replicas.get(), tc_.zero_stage == 1, tc_.bucket_mb),
      optimizer_(model_->params(), tc_.optimizer, reducer_.shard()) {}

void TrainingRun::start() {
  nlohmann::json loader_state;
  if (o_.resume) {
    const json state = resume_run(run_dir_, *model_, optimizer_, o_.model_config, lead_, experts_.holds);
    step_ = state.at("step").get<int64_t>();
    bad_steps_ = state.at("bad_steps").get<int64_t>();
    loader_state = state.at("loader");
    for (auto& source : sources_)
      if (state.contains(source->name())) source->set_state(state.at(source->name()));
  } else if (!o_.init_dir.empty()) {
    load_weights(*model_, o_.init_dir, o_.model_config, experts_.holds, /*extends_context=*/true);
    if (lead_) fmt::print("initialised from {}\n", o_.init_dir);
  } else {
    model_->initialize(tc_.seed);
  }
  if (!o_.resume && lead_) {
    const double entropy = unigram_entropy(data_dir_);
    fmt::print("data {}: unigram entropy {:.4f} nats per token (a context-free model's loss)\n", data_dir_.string(), entropy);
    write_file_atomic(run_dir_ / "run.json", json{{"model", config_.to_json()},
                                                  {"train", tc_.to_json()},
                                                  {"data", fs::absolute(data_dir_).string()},
                                                  {"processes", ranks_},
                                                  {"unigram_entropy", entropy}}
                                                     .dump(2) + "\n");
    write_file_atomic(run_dir_ / "metrics.jsonl", "");
  }
  // A resumed loader starts in its saved shape (the checkpoint may sit at a stage's last step); the
  // stage announcement then moves it to the current stage's, as the uninterrupted run did.
  const int64_t stage = tc_.stage_of(step_);
  const int64_t batch = loader_state.is_null() ? micro_batch_rows(stage) : loader_state.at("batch_size").get<int64_t>();
  const int64_t seq_len =
      loader_state.is_null() ? tc_.curriculum[size_t(stage)].seq_len : loader_state.at("seq_len").get<int64_t>();
  loader_.emplace(TokenLoader::from_directory(data_dir_, "train", batch, seq_len, LoaderMode::Random, tc_.seed));
  if (!loader_state.is_null()) loader_->set_state(loader_state);
}

void TrainingRun::print_setup() const {
  if (!lead_) return;
  const bool bf16 = tc_.precision == Precision::BF16;
  fmt::print("model {} ({:.1f}M params, {:.1f}M active), {} steps, {} matmuls, {} threads\n", o_.model_config,
             counts_.total_sum() * 1e-6, counts_.active_sum() * 1e-6, tc_.total_steps(), bf16 ? "bf16" : "f32",
             num_threads());
  fmt::print("MFU is relative to {:.0f} GFLOP/s{}: the best of {} {} oneDNN 2048^3 GEMMs at start-up, timed in CPU time "
             "per thread (other load on the machine lowers MFU, not this reference)\n",
             peak_gflops_, ranks_ > 1 ? fmt::format(" per process, x {} processes", ranks_) : "", kPeakRepetitions,
             bf16 ? "bf16" : "f32");
  const int64_t G = tc_.expert_parallel;
  if (ranks_ > 1)
    fmt::print("data parallel over {} processes: each takes 1/{} of every micro-batch; gradients {} in {:g} MB buckets "
               "during the backward{}{}\n",
               ranks_, ranks_, reducer_.sharded() ? "reduce-scattered" : "all-reduced", tc_.bucket_mb,
               reducer_.sharded() ? ", optimiser state sharded (ZeRO-1), weights all-gathered" : "",
               G > 1 ? fmt::format("; expert parallel in groups of {} (each process holds {} of {} routed experts per "
                                   "layer; dispatch and combine by all-to-all)",
                                   G, config_.moe.num_experts / G, config_.moe.num_experts)
                     : "");
}

void TrainingRun::announce(int64_t stage) const {
  if (!lead_) return;
  const CurriculumStage& st = tc_.curriculum[size_t(stage)];
  std::string notes;
  for (const auto& source : sources_) notes += source->stage_note(stage);
  fmt::print("stage {}/{}: seq_len {}, {} sequences per step ({} tokens), lr x{}, steps {}..{}{}\n", stage + 1,
             tc_.curriculum.size(), st.seq_len, st.sequences(), st.batch_tokens, st.lr_scale, tc_.stage_start(stage) + 1,
             tc_.stage_start(stage) + st.steps(), notes);
}

// The text rows this process trains on, then each source's rows in proportion to them.
ModelInput TrainingRun::micro_batch(int64_t stage) {
  loader_->next(windows_);
  if (ranks_ > 1) keep_rows_of(windows_, world_.rank(), ranks_);
  ModelInput in = next_token_input(windows_);
  const double text_rows = double(in.ids.size());
  std::vector<LossShare> shares;
  for (const auto& source : sources_) {
    const int64_t rows = source->rows(stage, text_rows);
    if (rows == 0) continue;
    const int64_t first = int64_t(in.targets.size());
    source->append(in, stage, rows);
    shares.push_back({first, int64_t(in.targets.size()), source->loss_share(stage)});
  }
  apply_loss_shares(in, shares);
  return in;
}

// The model FLOPs of a step at `stage`: its text tokens and the rows that run at the stage's
// length (long-context samples can outnumber the text rows many times over); image and agent
// rows, shorter and of their own lengths, do not count.
double TrainingRun::step_flops(int64_t stage) const {
  const CurriculumStage& s = tc_.curriculum[size_t(stage)];
  const double text_rows = double(s.sequences() / tc_.grad_accum);
  double rows = text_rows;
  for (const auto& source : sources_)
    if (source->runs_at_stage_length()) rows += double(source->rows(stage, text_rows));
  return 3.0 * token_flops(config_, counts_, s.seq_len).prefill() * double(s.batch_tokens) * rows / text_rows;
}

json TrainingRun::communication_since(const ReductionTraffic& before, const std::pair<int64_t, double>& exchanged_before,
                                      double busy_before, int64_t bytes_before) const {
  const ReductionTraffic& t = reducer_.traffic();
  const int64_t gradient_bytes = t.all_reduce_bytes + t.reduce_scatter_bytes + t.all_gather_bytes -
                                 before.all_reduce_bytes - before.reduce_scatter_bytes - before.all_gather_bytes;
  const auto exchanged = experts_.exchanged();
  return {{"processes", ranks_},
          {"all_reduce_bytes", t.all_reduce_bytes - before.all_reduce_bytes},
          {"expert_all_reduce_bytes", t.expert_all_reduce_bytes - before.expert_all_reduce_bytes},
          {"all_to_all_bytes", exchanged.first - exchanged_before.first},
          {"all_to_all_ms", (exchanged.second - exchanged_before.second) * 1e3},
          {"reduce_scatter_bytes", t.reduce_scatter_bytes - before.reduce_scatter_bytes},
          {"all_gather_bytes", t.all_gather_bytes - before.all_gather_bytes},
          {"other_bytes", world_.bytes() - bytes_before - gradient_bytes},
          {"comm_ms", (world_.busy_seconds() - busy_before) * 1e3},
          {"wait_ms", (t.wait_seconds - before.wait_seconds) * 1e3}};
}

// A skipped step counts towards max_bad_steps in a row, which stop the run; a good one resets the count.
void TrainingRun::count_bad_steps(const StepResult& r) {
  if (!r.skipped) {
    bad_steps_ = 0;
    return;
  }
  ++bad_steps_;
  if (lead_)
    fmt::print(stderr, "warning: step {}: non-finite {} (loss {}, grad norm {}); step skipped ({} in a row)\n", step_ + 1,
               std::isfinite(r.loss) ? "gradient" : "loss", r.loss, r.grad_norm, bad_steps_);
  HYLA_CHECK(bad_steps_ < tc_.max_bad_steps, "training stopped at step {}: {} non-finite steps in a row", step_ + 1,
             bad_steps_);
}

// Step step_ + 1's row of metrics.jsonl (a skipped step's loss and norm are null).
json TrainingRun::metrics_row(int64_t stage, double lr, const StepResult& r, double seconds) const {
  const int64_t seq_len = tc_.curriculum[size_t(stage)].seq_len;
  json row{{"step", step_ + 1}, {"stage", stage + 1}, {"seq_len", seq_len}, {"loss", r.loss}, {"lr", lr},
           {"grad_norm", r.grad_norm}, {"tokens", r.tokens}};
  if (r.aux_loss != 0) row["aux_loss"] = r.aux_loss;
  if (r.skipped) {
    row["skipped"] = true;
    row["loss"] = nullptr;
    row["grad_norm"] = nullptr;
  }
  const double tokens_per_s = double(r.tokens) / seconds;
  row["step_ms"] = seconds * 1e3;
  row["tokens_per_s"] = tokens_per_s;
  row["mfu"] = tokens_per_s * 3.0 * token_flops(config_, counts_, seq_len).prefill() * 1e-9 / (peak_gflops_ * ranks_);
  row["peak_gflops"] = peak_gflops_ * ranks_;
  json moe = json::array();
  for (const auto& load : model_->load_stats())
    moe.push_back({{"max_over_mean", load.max_over_mean}, {"dead", load.dead_experts}});
  if (!moe.empty()) row["moe"] = moe;
  return row;
}

void TrainingRun::print_step(const json& row, const StepResult& r, double elapsed, double eta) const {
  fmt::print("step {:>6}/{} | stage {} T={} | loss {:.4f} | lr {:.2e} | grad {:.3f} | {:6.0f} ms | {:6.0f} tok/s | "
             "MFU {:4.1f}% of {:.0f} GFLOP/s | {} elapsed, eta {}\n",
             step_, tc_.total_steps(), row["stage"].get<int64_t>(), row["seq_len"].get<int64_t>(),
             r.skipped ? NAN : r.loss, row["lr"].get<double>(), r.skipped ? NAN : r.grad_norm,
             row["step_ms"].get<double>(), row["tokens_per_s"].get<double>(), 100 * row["mfu"].get<double>(),
             peak_gflops_ * ranks_, clock_text(elapsed), clock_text(eta));
}

void TrainingRun::evaluate(int64_t stage, json& row) {
  const PerplexityResult e = evaluate_perplexity(*model_, data_dir_, "val",
                                                 tc_.curriculum[size_t(stage)].seq_len, micro_batch_rows(stage),
                                                 tc_.precision, false, tc_.eval_batches);
  row["val_loss"] = e.loss;
  row["val_ppl"] = std::exp(e.loss);
  if (lead_) fmt::print("eval step {}: val loss {:.4f}, perplexity {:.2f} ({} tokens)\n", step_, e.loss, std::exp(e.loss), e.tokens);
}

void TrainingRun::sample() {
  GenerationRequest request;
  request.prompt = tokenizer_.encode(tc_.sample_prompt);
  if (request.prompt.empty()) request.prompt = {tokenizer_.special_id("<|endoftext|>")};
  request.max_tokens = tc_.sample_tokens;
  request.sampling.temperature = tc_.sample_temperature;
  request.sampling.seed = uint64_t(step_);
  EngineOptions options;
  options.max_sequences = 1;
  options.context = int64_t(request.prompt.size()) + tc_.sample_tokens + 1;
  options.precision = tc_.precision;
  options.prefix_cache_bytes = 0;
  Scheduler sampler(*model_, tokenizer_, options);  // on this thread: no worker, no second OpenMP pool
  sampler.add(std::move(request));
  std::vector<Scheduler::Finished> done;
  while (done.empty()) done = sampler.step();
  if (lead_) fmt::print("sample step {}: {}{}\n", step_, tc_.sample_prompt, done.front().output.text);
}

json TrainingRun::trainer_state() const {
  json state = {{"step", step_}, {"bad_steps", bad_steps_}, {"loader", loader_->state()}};
  for (const auto& source : sources_) state[source->name()] = source->state();
  return state;
}

void TrainingRun::run() {
  sources_ = make_row_sources(tc_, o_.images_dirs, tokenizer_, config_.vision);
  start();
  // Timed in CPU time: on a shared machine the wall-clock peak drops with the other load and MFU
  // against it reads high; CPU time keeps the reference at what the cores do while they run.
  peak_gflops_ = measure_gemm_peak_gflops(tc_.precision == Precision::BF16, kPeakRepetitions, PeakClock::ProcessCpu);
  print_setup();

  // The ETA is the model FLOPs still to do over the rate this process has done them at, in wall
  // time with evaluations, samples and checkpoints included. Every stage of a curriculum may take
  // the same tokens per step, but longer sequences cost more attention FLOPs per token, so
  // remaining steps times the mean step time so far would promise the longer stages too soon. The
  // rate itself may differ between stages; the ETA corrects itself as each one runs.
  const int64_t total_steps = tc_.total_steps();
  double flops_left = 0, flops_done = 0;
  for (int64_t i = 0; i < int64_t(tc_.curriculum.size()); ++i) {
    const int64_t steps_left = tc_.stage_start(i) + tc_.curriculum[size_t(i)].steps() - std::max(step_, tc_.stage_start(i));
    if (steps_left > 0) flops_left += double(steps_left) * step_flops(i);
  }
  const auto loop_start = std::chrono::steady_clock::now();
  std::ofstream metrics;
  if (lead_) metrics.open(run_dir_ / "metrics.jsonl", std::ios::app);
  int64_t announced_stage = -1;

  while (step_ < total_steps) {
    const int64_t stage = tc_.stage_of(step_);
    const CurriculumStage& st = tc_.curriculum[size_t(stage)];
    if (stage != announced_stage) {
      loader_->set_batch_size(micro_batch_rows(stage));
      loader_->set_seq_len(st.seq_len);
      announce(stage);
      announced_stage = stage;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const double lr = learning_rate(tc_, step_);
    const ReductionTraffic traffic_before = reducer_.traffic();
    const auto exchanged_before = experts_.exchanged();
    const double busy_before = world_.busy_seconds();
    const int64_t bytes_before = world_.bytes();
    const StepResult r = train_step(*model_, optimizer_, tc_.step_settings(), lr,
                                    [&](int64_t) { return micro_batch(stage); }, reducer_);
    count_bad_steps(r);
    json row = metrics_row(stage, lr, r, seconds_since(t0));
    if (ranks_ > 1) row["comm"] = communication_since(traffic_before, exchanged_before, busy_before, bytes_before);
    ++step_;
    const double flops = step_flops(stage);
    flops_done += flops;
    flops_left -= flops;

    const bool last = step_ == total_steps;
    if (evaluates_ && tc_.eval_every > 0 && (step_ % tc_.eval_every == 0 || last)) evaluate(stage, row);
    if (lead_) {
      metrics << row.dump() << "\n";
      metrics.flush();
    }
    if (lead_ && !o_.quiet && (step_ % tc_.log_every == 0 || last)) {
      const double elapsed = seconds_since(loop_start);
      print_step(row, r, elapsed, std::max(0.0, flops_left) * elapsed / flops_done);
    }
    if (evaluates_ && tc_.sample_every > 0 && step_ % tc_.sample_every == 0 && !last) sample();
    if (tc_.checkpoint_every > 0 && (step_ % tc_.checkpoint_every == 0 || last))
      save_checkpoint(run_dir_, step_, *model_, optimizer_, trainer_state(), tokenizer_file_, tc_.keep_checkpoints, layout_);
  }
  save_model(run_dir_ / "model", *model_, tokenizer_file_, layout_);
  if (lead_)
    fmt::print("done: {} steps, {} in this process; model in {}\n", step_, clock_text(seconds_since(loop_start)),
               (run_dir_ / "model").string());
}

}  // namespace

void run_training(const TrainOptions& o) {
  if (o.deterministic) set_threads(1);
  // The run directory first: its refusal (an earlier run's checkpoints) comes before the model's
  // memory is taken, and it is in order before any process reads it.
  Collective& world = processes();
  if (world.rank() == 0) prepare_run_directory(o.run_dir, o.resume, o.overwrite);
  world.barrier();
  TrainingRun(o).run();
}

}  // namespace hyla
