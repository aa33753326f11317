#include "hyla/model/initialized_weights.h"

#include <fmt/format.h>

#include <map>
#include <mutex>

#include "hyla/core/error.h"
#include "hyla/kernels/mxfp4_gemm.h"
#include "hyla/model/expert_exchange.h"
#include "hyla/model/model.h"
#include "hyla/model/mxfp4_weights.h"

namespace hyla {

namespace {

constexpr size_t kExpertBatch = 16;

// The parameters of the config (no memory) and the expert tensors computed ahead of their reads.
class Source {
 public:
  Source(const ModelConfig& config, uint64_t seed, bool mxfp4_experts)
      : model_(config, /*allocate=*/false), seed_(seed), mxfp4_(mxfp4_experts) {
    for (const auto& p : model_.params().params()) {
      const int64_t e = routed_expert_of(p->name);
      if (e < 0) continue;
      std::string key = p->name;
      const std::string marker = fmt::format(".mlp.experts.{}.", e);
      key.replace(key.find(marker), marker.size(), ".mlp.experts.*.");
      std::vector<const Param*>& group = groups_[key];
      group_of_[p->name] = {&group, group.size()};
      group.push_back(p.get());
    }
  }

  const ParamStore& params() const { return model_.params(); }
  bool mxfp4(const Param& p) const { return mxfp4_ && p.mxfp4_allowed(); }

  Tensor values(const Param& p) const {
    Tensor t = Tensor::empty(DType::F32, p.shape);
    initial_values(p, model_.config(), seed_, t.data<float>());
    return t;
  }

  // A routed expert's tensor (`name` its weight, or with `scale` its MXFP4 scales).
  Tensor expert(const std::string& name, bool scale) {
    const std::string key = scale ? mxfp4_scale_name(name) : name;
    std::lock_guard<std::mutex> lock(mutex_);
    if (!ready_.count(key)) compute_from(name);
    Tensor t = std::move(ready_.at(key));
    ready_.erase(key);
    return t;
  }

 private:
  void compute_from(const std::string& name) {
    const auto& [group, first] = group_of_.at(name);
    const size_t last = std::min(group->size(), first + kExpertBatch);
    std::vector<std::vector<std::pair<std::string, Tensor>>> out(last - first);
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = first; i < last; ++i) {
      const Param& p = *(*group)[i];
      Tensor v = values(p);
      if (!mxfp4(p)) {
        out[i - first].emplace_back(p.name, std::move(v));
        continue;
      }
      const int64_t rows = p.shape[0], cols = p.shape[1];
      Tensor codes = Tensor::empty(DType::U8, Shape{rows, cols / 2});
      Tensor scales = Tensor::empty(DType::U8, Shape{rows, cols / 32});
      quantize_mxfp4_weights(v.data<float>(), rows, cols, codes.data<uint8_t>(), scales.data<uint8_t>());
      out[i - first].emplace_back(p.name, std::move(codes));
      out[i - first].emplace_back(mxfp4_scale_name(p.name), std::move(scales));
    }
    for (auto& tensors : out)
      for (auto& [key, t] : tensors) ready_[key] = std::move(t);
  }

  Model model_;
  uint64_t seed_;
  bool mxfp4_;
  std::map<std::string, std::vector<const Param*>> groups_;
  std::map<std::string, std::pair<std::vector<const Param*>*, size_t>> group_of_;
  std::mutex mutex_;
  std::map<std::string, Tensor> ready_;
};

}  // namespace

std::shared_ptr<const ModelWeights> initialized_weights(const ModelConfig& config, uint64_t seed, bool mxfp4_experts) {
  auto source = std::make_shared<Source>(config, seed, mxfp4_experts);
  auto weights = std::make_shared<ModelWeights>();
  const std::string file = fmt::format("initialised weights (seed {})", seed);
  for (const auto& param : source->params().params()) {
    const Param& p = *param;
    const bool expert = routed_expert_of(p.name) >= 0;
    if (source->mxfp4(p)) {
      HYLA_CHECK(p.shape.ndim() == 2 && p.shape[1] % 32 == 0,
                 "{}: MXFP4 needs rows of whole 32-value blocks, '{}' has {}", file, p.name, p.shape.str());
      const int64_t rows = p.shape[0], cols = p.shape[1];
      weights->add({p.name, DType::U8, Shape{rows, cols / 2}, 0, uint64_t(rows * cols / 2)}, file,
                   [source, name = p.name] { return source->expert(name, false); });
      weights->add({mxfp4_scale_name(p.name), DType::U8, Shape{rows, cols / 32}, 0, uint64_t(rows * cols / 32)}, file,
                   [source, name = p.name] { return source->expert(name, true); });
    } else if (expert) {
      weights->add({p.name, DType::F32, p.shape, 0, uint64_t(p.numel() * 4)}, file,
                   [source, name = p.name] { return source->expert(name, false); });
    } else {
      weights->add({p.name, DType::F32, p.shape, 0, uint64_t(p.numel() * 4)}, file,
                   [source, &p] { return source->values(p); });
    }
  }
  return weights;
}

}  // namespace hyla
