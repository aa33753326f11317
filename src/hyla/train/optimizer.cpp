#include "hyla/train/optimizer.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstring>
#include <string_view>

#include "hyla/core/error.h"
#include "hyla/io/safetensors.h"

namespace hyla {

AdamW::AdamW(ParamStore& params, const OptimizerConfig& c) : AdamW(params, c, FlatRange{0, params.numel()}) {}

AdamW::AdamW(ParamStore& params, const OptimizerConfig& c, FlatRange shard)
    : params_(params), shard_(shard), beta1_(c.beta1), beta2_(c.beta2), eps_(c.eps), weight_decay_(c.weight_decay) {
  HYLA_ASSERT(params.allocated() && shard.first >= 0 && shard.end() <= params.numel());
  constexpr int64_t kChunk = int64_t(1) << 16;
  for (const auto& p : params.params()) {
    if (!p->held || !p->trainable) continue;
    const int64_t offset = p->v() - params.values();
    const int64_t first = std::max(offset, shard.first), end = std::min(offset + p->numel(), shard.end());
    for (int64_t i = first; i < end; i += kChunk) ranges_.push_back({i, std::min(kChunk, end - i), p->weight_decay});
  }
  m_ = Tensor::zeros(DType::F32, {std::max<int64_t>(shard.count, 1)});
  v_ = Tensor::zeros(DType::F32, {std::max<int64_t>(shard.count, 1)});
  if (shard.first == 0 && shard.count == params.numel()) {
    shard_grads_ = params.grads();
  } else {
    own_grads_ = Tensor::zeros(DType::F32, {std::max<int64_t>(shard.count, 1)});
    shard_grads_ = own_grads_.data<float>();
  }
}

double AdamW::grad_square_sum() const {
  const float* g = shard_grads_ - shard_.first;  // indexed by flat offset
  double sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : sum)
  for (size_t r = 0; r < ranges_.size(); ++r) {
    double s = 0;
    for (int64_t i = ranges_[r].offset; i < ranges_[r].offset + ranges_[r].count; ++i) s += double(g[i]) * g[i];
    sum += s;
  }
  return sum;
}

void AdamW::step(double lr, float grad_scale) {
  ++steps_;
  const double bias1 = 1.0 - std::pow(beta1_, double(steps_)), bias2 = 1.0 - std::pow(beta2_, double(steps_));
  const float b1 = float(beta1_), b2 = float(beta2_), eps = float(eps_);
  const float step_size = float(lr / bias1), inv_sqrt_bias2 = float(1.0 / std::sqrt(bias2));
  float* w = params_.values();
  bf16* w16 = params_.values_bf16();
  // The shard's buffers, indexed by flat offset like the weights.
  const float* g = shard_grads_ - shard_.first;
  float* m = m_.data<float>() - shard_.first;
  float* v = v_.data<float>() - shard_.first;
#pragma omp parallel for schedule(dynamic, 4)
  for (size_t r = 0; r < ranges_.size(); ++r) {
    const Range& range = ranges_[r];
    const float decay = range.decay ? float(1.0 - lr * weight_decay_) : 1.0f;
    const int64_t end = range.offset + range.count;
#pragma omp simd
    for (int64_t i = range.offset; i < end; ++i) {
      const float grad = g[i] * grad_scale;
      m[i] = b1 * m[i] + (1.0f - b1) * grad;
      v[i] = b2 * v[i] + (1.0f - b2) * grad * grad;
      w[i] = w[i] * decay - step_size * m[i] / (std::sqrt(v[i]) * inv_sqrt_bias2 + eps);
    }
    convert(w + range.offset, w16 + range.offset, size_t(range.count));
  }
}

namespace {

// A trainable parameter's elements inside a shard: [first, end) of its own elements, and where
// they sit in the flat buffers.
struct Piece {
  int64_t first = 0, end = 0, offset = 0;  // offset: the flat index of element 0
};

Piece piece_of(const Param& p, const float* values, FlatRange shard) {
  const int64_t offset = p.value.data<float>() - values;
  const int64_t first = std::max(offset, shard.first), end = std::min(offset + p.numel(), shard.end());
  if (first >= end) return {0, 0, offset};
  return {first - offset, end - offset, offset};
}

constexpr std::string_view kMoment[2] = {"adam.m/", "adam.v/"};

}  // namespace

void AdamW::save(const std::filesystem::path& path, const std::function<bool(const Param&)>& writes) const {
  Tensor step = Tensor::empty(DType::I64, {1});
  step.data<int64_t>()[0] = steps_;
  NamedTensors tensors{{"adam.step", step}};
  const Tensor* moments[2] = {&m_, &v_};
  for (const auto& p : params_.params()) {
    if (!p->held || !p->trainable || (writes && !writes(*p))) continue;
    const Piece piece = piece_of(*p, params_.values(), shard_);
    if (piece.first >= piece.end) continue;
    for (int i = 0; i < 2; ++i)
      tensors.emplace_back(fmt::format("{}{}/{}", kMoment[i], p->name, piece.first),
                           moments[i]->rows(piece.offset + piece.first - shard_.first, piece.offset + piece.end - shard_.first));
  }
  save_safetensors(path, tensors);
}

void AdamW::load(const std::vector<std::filesystem::path>& paths) {
  int64_t covered = 0, wanted = 0;
  for (const auto& p : params_.params())
    if (p->held && p->trainable) {
      const Piece piece = piece_of(*p, params_.values(), shard_);
      wanted += piece.end - piece.first;
    }
  Tensor* moments[2] = {&m_, &v_};
  for (const auto& path : paths) {
    const SafetensorsFile file(path);
    const SafetensorsEntry* s = file.find("adam.step");
    HYLA_CHECK(s && s->dtype == DType::I64, "{}: missing 'adam.step'", path.string());
    steps_ = file.get("adam.step").data<int64_t>()[0];
    for (const SafetensorsEntry& e : file.header().tensors) {
      if (e.name == "adam.step") continue;
      const int i = e.name.starts_with(kMoment[0]) ? 0 : e.name.starts_with(kMoment[1]) ? 1 : -1;
      const size_t slash = e.name.rfind('/');
      HYLA_CHECK(i >= 0 && slash > kMoment[i].size() && e.dtype == DType::F32,
                 "{}: '{}' is not an f32 adam.m/NAME/FIRST or adam.v/NAME/FIRST tensor", path.string(), e.name);
      const Param* p = params_.find(e.name.substr(kMoment[i].size(), slash - kMoment[i].size()));
      HYLA_CHECK(p != nullptr, "{}: '{}' names no parameter of this model", path.string(), e.name);
      if (!p->held || !p->trainable) continue;
      int64_t saved_first = 0;
      const std::string first_text = e.name.substr(slash + 1);
      const auto [end, ec] = std::from_chars(first_text.data(), first_text.data() + first_text.size(), saved_first);
      const int64_t saved_end = saved_first + e.shape.numel();
      HYLA_CHECK(ec == std::errc() && end == first_text.data() + first_text.size() && saved_first >= 0 &&
                     saved_end <= p->numel(),
                 "{}: '{}' does not fit parameter {} ({} elements)", path.string(), e.name, p->name, p->numel());
      const Piece mine = piece_of(*p, params_.values(), shard_);
      const int64_t lo = std::max(mine.first, saved_first), hi = std::min(mine.end, saved_end);
      if (lo >= hi) continue;
      const Tensor values = file.get(e.name);
      std::memcpy(moments[i]->data<float>() + (mine.offset + lo - shard_.first), values.data<float>() + (lo - saved_first),
                  size_t(hi - lo) * 4);
      if (i == 0) covered += hi - lo;
    }
  }
  HYLA_CHECK(covered == wanted, "optimiser state in {}: covers {} of the {} moments this process needs",
             paths.empty() ? std::string("no file") : paths.front().parent_path().string(), covered, wanted);
}

}  // namespace hyla
