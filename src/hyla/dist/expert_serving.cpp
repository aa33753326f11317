#include "hyla/dist/expert_serving.h"

#include <fmt/format.h>

#include <cstdio>

#include "hyla/core/error.h"
#include "hyla/core/workspace.h"
#include "hyla/dist/expert_parallel.h"
#include "hyla/dist/processes.h"
#include "hyla/model/ffn.h"
#include "hyla/model/model_files.h"

namespace hyla {
namespace {

constexpr const char* kStop = "stop";

// Rank 0's side of one MoE layer: says which layer follows, then exchanges.
class LeadingExchange final : public ExpertExchange {
 public:
  LeadingExchange(Collective& world, int layer) : world_(world), layer_(layer), exchange_(world) {}
  void forward(const ExpertDispatch& dispatch, const float* x, int64_t width, float* slot_rows, const Compute& compute,
               const Held& held) override {
    std::string header = fmt::format("{} {}", layer_, held.precision == Precision::BF16 ? "bf16" : "f32");
    world_.broadcast(header);
    exchange_.forward(dispatch, x, width, slot_rows, compute, Held{held.experts, held.precision, false, held.workspace});
  }
  void backward(const ExpertDispatch&, const float*, int64_t, float*, float*, const Compute&, const Held&) override {
    fail("a model served across processes runs inference only (train with mpirun hyla train)");
  }

 private:
  Collective& world_;
  int layer_;
  ExpertParallelExchange exchange_;
};

// The routed experts process `rank` of `size` holds (and, for rank 0, everything else too).
std::function<bool(const Param&)> share_of(const ModelConfig& config, int rank, int size) {
  const auto [first, last] = expert_range(config.moe.num_experts, rank, size);
  return [first, last, rank](const Param& p) {
    const int64_t e = routed_expert_of(p.name);
    return e < 0 ? rank == 0 : e >= first && e < last;
  };
}

// Once per job, when every process holds its share: from then on a process that answers nothing
// for the exchange timeout is a fault (before, one may still be reading its experts).
void all_loaded(Collective& world) {
  static bool done = false;
  if (done) return;
  world.barrier();
  world.set_exchange_timeout(exchange_timeout());
  done = true;
}

}  // namespace

std::unique_ptr<Model> load_model_across_processes(const std::filesystem::path& dir, const ModelLoadOptions& options) {
  Collective& world = processes();
  if (world.size() == 1) return Model::load(dir, options);
  HYLA_ASSERT(world.rank() == 0);
  HYLA_CHECK(!options.offload_experts && !options.holds,
             "--expert-memory does not combine with several processes: the experts are already split over {}",
             world.size());
  const ModelConfig config = open_model_files(dir, {.mmproj = options.mmproj}).config;
  HYLA_CHECK(config.moe.num_experts >= world.size(), "{}: {} routed experts cannot be split over {} processes",
             dir.string(), config.moe.num_experts, world.size());
  auto model = Model::load(dir, {.holds = share_of(config, 0, world.size()), .decode_quantized = options.decode_quantized,
                                 .mmproj = options.mmproj});
  std::vector<std::unique_ptr<ExpertExchange>> exchanges;
  for (size_t i = 0; i < model->moe_layers().size(); ++i)
    exchanges.push_back(std::make_unique<LeadingExchange>(world, int(i)));
  model->own_expert_exchanges(std::move(exchanges));
  all_loaded(world);
  return model;
}

bool serve_experts_to_rank0(const std::filesystem::path& dir, const ModelLoadOptions& options) {
  Collective& world = processes();
  if (world.size() == 1) return false;
  if (world.rank() == 0) {
    at_stop([&world] {
      std::string stop = kStop;
      world.broadcast(stop);
    });
    return false;
  }
  const ModelConfig config = open_model_files(dir, {.mmproj = options.mmproj}).config;
  const auto model = Model::load(dir, {.holds = share_of(config, world.rank(), world.size()),
                                       .decode_quantized = options.decode_quantized, .mmproj = options.mmproj});
  const std::vector<MoeFfn*> layers = model->moe_layers();
  std::vector<std::unique_ptr<ExpertParallelExchange>> exchanges;
  for (size_t i = 0; i < layers.size(); ++i) exchanges.push_back(std::make_unique<ExpertParallelExchange>(world));
  ExpertDispatch nothing;  // this process routes no tokens of its own
  nothing.k = config.moe.num_experts_per_tok, nothing.experts = config.moe.num_experts;
  nothing.load.assign(size_t(nothing.experts), 0);
  nothing.offsets.assign(size_t(nothing.experts + 1), 0);
  Workspace workspace;
  all_loaded(world);
  for (;;) {
    std::string header;
    world.broadcast(header);
    if (header == kStop) return true;
    int layer = -1;
    char precision[8] = {};
    HYLA_ASSERT(std::sscanf(header.c_str(), "%d %7s", &layer, precision) == 2 && layer >= 0 &&
                layer < int(layers.size()));
    RoutedExperts& experts = layers[size_t(layer)]->routed_experts();
    const ExpertExchange::Held held{experts, std::string(precision) == "bf16" ? Precision::BF16 : Precision::F32,
                                    false, workspace};
    exchanges[size_t(layer)]->forward(nothing, nullptr, experts.in(), nullptr, {}, held);
  }
}

}  // namespace hyla
