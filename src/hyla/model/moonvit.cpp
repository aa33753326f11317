#include "hyla/model/moonvit.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "hyla/core/error.h"
#include "hyla/kernels/activations.h"
#include "hyla/kernels/attention.h"
#include "hyla/kernels/layout.h"
#include "hyla/kernels/norm.h"
#include "hyla/kernels/residual.h"
#include "hyla/kernels/rope.h"

namespace hyla {
namespace {

// rows of `dim` values each += bias (a plain loop: O(rows·dim) beside the products' O(rows·dim·in)).
void add_bias(const Param* bias, int64_t rows, int64_t dim, float* y) {
  if (!bias) return;
  const float* b = bias->value.data<float>();
  for (int64_t r = 0; r < rows; ++r)
#pragma omp simd
    for (int64_t j = 0; j < dim; ++j) y[r * dim + j] += b[j];
}

// bias gradient += the column sums of dy [rows, dim], rows in order.
void add_bias_grad(Param* bias, const float* dy, int64_t rows, int64_t dim) {
  if (!bias) return;
  float* g = bias->g();
  for (int64_t r = 0; r < rows; ++r)
#pragma omp simd
    for (int64_t j = 0; j < dim; ++j) g[j] += dy[r * dim + j];
}

float* grow(Tensor& t, int64_t n) {
  if (!t.defined() || t.numel() < n) t = Tensor::empty(DType::F32, {std::max<int64_t>(n, 1)});
  return t.data<float>();
}

}  // namespace

TowerImage moonvit_patchify(const Image& image, const VisionConfig& vision, std::string_view source, float* out) {
  const int64_t P = vision.patch_size, window = vision.moonvit.merge * P;
  HYLA_CHECK(image.channels == 3 && image.height > 0 && image.width > 0 && image.height % window == 0 &&
                 image.width % window == 0 && int64_t(image.pixels.size()) == image.height * image.width * 3,
             "{}: a {}x{}x{} image; the vision tower reads RGB with sides multiples of {}", source, image.width,
             image.height, image.channels, window);
  const MoonVitConfig& m = vision.moonvit;
  // x/255 in double, then − mean and × 1/std, as the processor's numpy does.
  float table[3][256];
  for (int c = 0; c < 3; ++c)
    for (int v = 0; v < 256; ++v)
      table[c][v] = float((double(v) / 255.0 - m.image_mean[size_t(c)]) * (1.0 / m.image_std[size_t(c)]));
  const TowerImage grid{image.height / P, image.width / P, out};
  for (int64_t r = 0; r < grid.grid_rows; ++r)
    for (int64_t col = 0; col < grid.grid_cols; ++col)
      for (int64_t c = 0; c < 3; ++c)
        for (int64_t y = 0; y < P; ++y)
          for (int64_t x = 0; x < P; ++x)
            *out++ = table[c][image.pixels[size_t(((r * P + y) * image.width + col * P + x) * 3 + c)]];
  return grid;
}

MoonVit::Norm MoonVit::make_norm(ParamStore& store, const std::string& name, int64_t dim,
                                         bool with_bias) const {
  Norm n;
  n.weight = &store.add(name + ".weight", {dim}, Init::Ones, Component::Vision, /*weight_decay=*/false);
  if (with_bias) n.bias = &store.add(name + ".bias", {dim}, Init::Zeros, Component::Vision, false);
  return n;
}

Param* MoonVit::make_bias(ParamStore& store, const std::string& name, int64_t dim, bool present) const {
  return present ? &store.add(name + ".bias", {dim}, Init::Zeros, Component::Vision, false) : nullptr;
}

void MoonVit::Norm::forward(VisionNorm kind, const float* x, int64_t rows, int64_t dim, float eps,
                                float* y, float* stats) const {
  if (kind == VisionNorm::LayerNorm)
    layernorm_forward(x, dim, weight->v(), bias ? bias->v() : nullptr, rows, dim, eps, y, dim, stats);
  else
    rmsnorm_forward(x, dim, weight->v(), rows, dim, eps, y, dim, stats);
}

void MoonVit::Norm::backward(VisionNorm kind, const float* x, int64_t rows, int64_t dim,
                                 const float* stats, const float* dy, float* dx, bool accumulate,
                                 Workspace& workspace) const {
  if (kind == VisionNorm::LayerNorm)
    layernorm_backward(x, dim, weight->v(), stats, dy, dim, rows, dim, dx, dim, accumulate, weight->g(),
                       bias ? bias->g() : nullptr, workspace);
  else
    rmsnorm_backward(x, dim, weight->v(), stats, dy, dim, rows, dim, dx, dim, accumulate, weight->g(), workspace);
}

MoonVit::MoonVit(ParamStore& store, const VisionConfig& vision, int64_t text_hidden)
    : config_(vision.moonvit),
      patch_values_(vision.channels * vision.patch_size * vision.patch_size),
      text_hidden_(text_hidden) {
  const MoonVitConfig& c = config_;
  HYLA_CHECK(c.head_dim > 0 && c.head_dim % 4 == 0 && c.merge > 0,
             "vision tower: head_dim {} must be a positive multiple of 4 (2-D rotary pairs), merge {} positive",
             c.head_dim, c.merge);
  const int64_t D = c.hidden_size, inner = c.num_heads * c.head_dim, merged = c.merge * c.merge * D;
  const bool layer_norm = c.norm == VisionNorm::LayerNorm;
  patch_embed_ = Linear(store, "vision_tower.patch_embed.proj", patch_values_, D, Component::Vision);
  patch_bias_ = make_bias(store, "vision_tower.patch_embed.proj", D, c.bias);
  pos_emb_ = &store.add("vision_tower.patch_embed.pos_emb.weight", {c.pos_emb_height, c.pos_emb_width, D},
                        Init::Normal, Component::Vision);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "vision_tower.encoder.blocks." + std::to_string(l);
    Block b;
    b.norm0 = make_norm(store, p + ".norm0", D, layer_norm);
    b.norm1 = make_norm(store, p + ".norm1", D, layer_norm);
    b.wqkv = Linear(store, p + ".wqkv", D, 3 * inner, Component::Vision);
    b.wqkv_bias = make_bias(store, p + ".wqkv", 3 * inner, c.bias);
    b.wo = Linear(store, p + ".wo", inner, D, Component::Vision, Init::NormalOutput);
    b.wo_bias = make_bias(store, p + ".wo", D, c.bias);
    b.fc0 = Linear(store, p + ".mlp.fc0", D, c.intermediate_size, Component::Vision);
    b.fc0_bias = make_bias(store, p + ".mlp.fc0", c.intermediate_size, c.bias);
    b.fc1 = Linear(store, p + ".mlp.fc1", c.intermediate_size, D, Component::Vision, Init::NormalOutput);
    b.fc1_bias = make_bias(store, p + ".mlp.fc1", D, c.bias);
    blocks_.push_back(b);
  }
  final_norm_ = make_norm(store, "vision_tower.encoder.final_layernorm", D, layer_norm);
  const bool v1 = c.projector == VisionProjector::PatchMerger;
  if (v1) pre_norm_ = make_norm(store, "mm_projector.pre_norm", D, true);
  proj0_ = Linear(store, "mm_projector.proj.0", merged, merged, Component::Vision);
  proj0_bias_ = make_bias(store, "mm_projector.proj.0", merged, v1);
  proj2_ = Linear(store, "mm_projector.proj.2", merged, text_hidden_, Component::Vision);
  proj2_bias_ = make_bias(store, "mm_projector.proj.2", text_hidden_, v1);
  if (!v1) post_norm_ = make_norm(store, "mm_projector.post_norm", text_hidden_, false);
}

int64_t MoonVit::tokens(const TowerImage& image) const {
  return (image.grid_rows / config_.merge) * (image.grid_cols / config_.merge);
}

void MoonVit::forward(std::span<const TowerImage> images, float* out, Precision precision, Workspace& workspace,
                          bool save) {
  const MoonVitConfig& c = config_;
  const int64_t D = c.hidden_size, H = c.num_heads, hd = c.head_dim, inner = H * hd, I = c.intermediate_size;
  const int64_t m = c.merge, merged = m * m * D, text = text_hidden_, L = c.num_layers;
  const float eps = float(c.norm_eps);
  const auto norm = c.norm;

  // The packed batch: image i owns patch rows [starts[i], starts[i+1]).
  starts_.assign(1, 0);
  patch_rows_.clear(), patch_cols_.clear();
  int64_t out_rows = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    const TowerImage& img = images[i];
    HYLA_CHECK(img.grid_rows > 0 && img.grid_cols > 0 && img.grid_rows % m == 0 && img.grid_cols % m == 0,
               "image {}: a grid of {}x{} patches is not a positive multiple of the merge {}", i, img.grid_rows,
               img.grid_cols, m);
    HYLA_CHECK(img.patches != nullptr, "image {}: no patch values", i);
    starts_.push_back(starts_.back() + img.grid_rows * img.grid_cols);
    for (int64_t r = 0; r < img.grid_rows; ++r)
      for (int64_t col = 0; col < img.grid_cols; ++col) patch_rows_.push_back(r), patch_cols_.push_back(col);
    out_rows += tokens(img);
  }
  const int64_t n = starts_.back(), batch = int64_t(images.size());
  saved_ = save, precision_ = precision, patches_ = n, out_rows_ = out_rows;
  saved_images_.assign(images.begin(), images.end());
  if (n == 0) return;

  // The arena: per block when saving (the x_in of block l+1 is the x_out of block l), else one
  // set of buffers every block reuses in place.
  const int64_t per_block = 2 * n * D + 2 * n + n * D + 4 * n * inner + n * H + 2 * n + n * D + n * I;
  const int64_t blocks_held = save ? L : 1;
  const int64_t tail = 2 * n + n * D + 4 * out_rows * merged + 2 * out_rows * m * m + out_rows * text + 2 * out_rows;
  float* p = grow(arena_, blocks_held * per_block + n * D + tail);
  auto take = [&p](int64_t count) { return std::exchange(p, p + count); };
  acts_.resize(size_t(L));
  for (int64_t l = 0; l < L; ++l) {
    BlockActivations& a = acts_[size_t(l)];
    if (l >= blocks_held) {
      a = acts_[0];
      continue;
    }
    a.x_in = take(n * D), a.stats0 = take(2 * n), a.normed0 = take(n * D), a.q = take(n * inner),
    a.k = take(n * inner), a.v = take(n * inner), a.attn = take(n * inner), a.lse = take(n * H),
    a.x_mid = take(n * D), a.stats1 = take(2 * n), a.normed1 = take(n * D), a.pre_gelu = take(n * I);
  }
  if (!save)
    for (BlockActivations& a : acts_) a.x_mid = a.x_in;  // the residual stream updated in place
  x_final_ = save ? take(n * D) : acts_[0].x_in;
  stats_final_ = take(2 * n), normed_final_ = take(n * D);
  merged_raw_ = take(out_rows * merged), merged_ = take(out_rows * merged), stats_pre_ = take(2 * out_rows * m * m);
  pre_gelu_proj_ = take(out_rows * merged), post_gelu_proj_ = take(out_rows * merged);
  out_pre_ = take(out_rows * text), stats_post_ = take(2 * out_rows);
  float* qkv = grow(scratch_, n * std::max(3 * inner, I));
  float* rope = grow(rope_, n * hd);

  // Patch embedding, then the learned positions resized to each image's grid.
  float* x = acts_[0].x_in;
  for (int64_t i = 0; i < batch; ++i) {
    const TowerImage& img = images[size_t(i)];
    const int64_t rows = img.grid_rows * img.grid_cols;
    float* xi = x + starts_[size_t(i)] * D;
    patch_embed_.forward(img.patches, rows, xi, precision);
    add_bias(patch_bias_, rows, D, xi);
    float* pos = grow(pos_, rows * D);
    resample_grid(c.pos_emb_resample, pos_emb_->v(), c.pos_emb_height, c.pos_emb_width, D, pos, img.grid_rows,
                  img.grid_cols);
    add_rows(xi, pos, rows, D, xi);
  }
  rope_table_2d(patch_rows_.data(), patch_cols_.data(), n, hd, c.rope_theta, rope);

  const AttentionDims dims{H, hd, hd, 0, float(1.0 / std::sqrt(double(hd))),
                           attention_use_bf16_products(!save && precision == Precision::BF16), /*causal=*/false};
  const HeadLayout packed{inner, hd}, in_qkv{3 * inner, hd};
  for (int64_t l = 0; l < L; ++l) {
    const Block& b = blocks_[size_t(l)];
    const BlockActivations& a = acts_[size_t(l)];
    float* x_out = l + 1 < L ? acts_[size_t(l + 1)].x_in : x_final_;
    b.norm0.forward(norm, a.x_in, n, D, eps, a.normed0, a.stats0);
    b.wqkv.forward(a.normed0, n, qkv, precision);
    add_bias(b.wqkv_bias, n, 3 * inner, qkv);
    rope_forward(rope, n, H, hd, qkv, in_qkv, a.q, packed);
    rope_forward(rope, n, H, hd, qkv + inner, in_qkv, a.k, packed);
    copy_heads(qkv + 2 * inner, in_qkv, n, H, hd, a.v, packed);
    attention_forward(dims, batch, starts_.data(), starts_.data(), a.q, a.k, a.v, a.attn, a.lse, workspace);
    if (a.x_mid != a.x_in) std::copy(a.x_in, a.x_in + n * D, a.x_mid);
    b.wo.forward(a.attn, n, a.x_mid, precision, /*beta=*/1.0f);  // the residual added by the product
    add_bias(b.wo_bias, n, D, a.x_mid);

    b.norm1.forward(norm, a.x_mid, n, D, eps, a.normed1, a.stats1);
    b.fc0.forward(a.normed1, n, a.pre_gelu, precision);
    add_bias(b.fc0_bias, n, I, a.pre_gelu);
    gelu_forward(Gelu::Tanh, a.pre_gelu, n * I, qkv);
    if (x_out != a.x_mid) std::copy(a.x_mid, a.x_mid + n * D, x_out);
    b.fc1.forward(qkv, n, x_out, precision, /*beta=*/1.0f);
    add_bias(b.fc1_bias, n, D, x_out);
  }
  final_norm_.forward(norm, x_final_, n, D, eps, normed_final_, stats_final_);

  // The merge: output row (i, j) of an image's (rows/m)×(cols/m) grid is its m×m window's patches
  // concatenated row-major, [(mi, mj), (mi, mj+1), …, (mi+m−1, mj+m−1)].
  int64_t t = 0;
  for (int64_t i = 0; i < batch; ++i) {
    const TowerImage& img = images[size_t(i)];
    const float* base = normed_final_ + starts_[size_t(i)] * D;
    for (int64_t gi = 0; gi < img.grid_rows / m; ++gi)
      for (int64_t gj = 0; gj < img.grid_cols / m; ++gj, ++t)
        for (int64_t wi = 0; wi < m; ++wi)
          for (int64_t wj = 0; wj < m; ++wj) {
            const float* src = base + ((gi * m + wi) * img.grid_cols + gj * m + wj) * D;
            std::copy(src, src + D, merged_raw_ + t * merged + (wi * m + wj) * D);
          }
  }

  // The projector.
  const float* cat = merged_raw_;
  if (pre_norm_.weight) {
    pre_norm_.forward(VisionNorm::LayerNorm, merged_raw_, out_rows * m * m, D, float(c.projector_eps),
                      merged_, stats_pre_);
    cat = merged_;
  }
  proj0_.forward(cat, out_rows, pre_gelu_proj_, precision);
  add_bias(proj0_bias_, out_rows, merged, pre_gelu_proj_);
  gelu_forward(c.projector_gelu, pre_gelu_proj_, out_rows * merged, post_gelu_proj_);
  float* z = post_norm_.weight ? out_pre_ : out;
  proj2_.forward(post_gelu_proj_, out_rows, z, precision);
  add_bias(proj2_bias_, out_rows, text, z);
  if (post_norm_.weight)
    post_norm_.forward(VisionNorm::RmsNorm, out_pre_, out_rows, text, float(c.projector_eps), out,
                       stats_post_);
}

void MoonVit::backward(const float* d_out, Workspace& workspace) {
  HYLA_CHECK(saved_, "vision tower: backward without a saved forward");
  const MoonVitConfig& c = config_;
  const int64_t D = c.hidden_size, H = c.num_heads, hd = c.head_dim, inner = H * hd, I = c.intermediate_size;
  const int64_t m = c.merge, merged = m * m * D, text = text_hidden_, L = c.num_layers;
  const int64_t n = patches_, T = out_rows_, batch = int64_t(saved_images_.size());
  const Precision precision = precision_;
  const auto norm = c.norm;
  if (n == 0) return;
  // Scratch: the gradient of the projector's rows, of its middle, of the merge, of the stream,
  // and of one block's widest intermediate.
  const int64_t widest = std::max({3 * inner, I, D});
  float* d_z = grow(scratch_, T * text + 2 * T * merged + n * D + 2 * n * widest);
  float* d_mid = d_z + T * text;
  float* d_cat = d_mid + T * merged;
  float* d_x = d_cat + T * merged;
  float* work = d_x + n * D;
  float* work2 = work + n * widest;

  // The projector, back to the merge.
  std::copy(d_out, d_out + T * text, d_z);
  if (post_norm_.weight)
    post_norm_.backward(VisionNorm::RmsNorm, out_pre_, T, text, stats_post_, d_out, d_z, false, workspace);
  add_bias_grad(proj2_bias_, d_z, T, text);
  proj2_.backward_weight(post_gelu_proj_, d_z, T, precision);
  proj2_.backward_input(d_z, T, d_mid, precision);
  gelu_backward(c.projector_gelu, pre_gelu_proj_, d_mid, T * merged, d_mid);
  add_bias_grad(proj0_bias_, d_mid, T, merged);
  proj0_.backward_weight(pre_norm_.weight ? merged_ : merged_raw_, d_mid, T, precision);
  proj0_.backward_input(d_mid, T, d_cat, precision);
  if (pre_norm_.weight)
    pre_norm_.backward(VisionNorm::LayerNorm, merged_raw_, T * m * m, D, stats_pre_, d_cat, d_cat, false,
                       workspace);
  // The merge's transpose: each window piece back to its patch row.
  float* d_y = work;  // [n, D]
  int64_t t = 0;
  for (int64_t i = 0; i < batch; ++i) {
    const TowerImage& img = saved_images_[size_t(i)];
    float* base = d_y + starts_[size_t(i)] * D;
    for (int64_t gi = 0; gi < img.grid_rows / m; ++gi)
      for (int64_t gj = 0; gj < img.grid_cols / m; ++gj, ++t)
        for (int64_t wi = 0; wi < m; ++wi)
          for (int64_t wj = 0; wj < m; ++wj) {
            const float* src = d_cat + t * merged + (wi * m + wj) * D;
            std::copy(src, src + D, base + ((gi * m + wi) * img.grid_cols + gj * m + wj) * D);
          }
  }
  final_norm_.backward(norm, x_final_, n, D, stats_final_, d_y, d_x, false, workspace);

  const AttentionDims dims{H, hd, hd, 0, float(1.0 / std::sqrt(double(hd))), false, /*causal=*/false};
  const HeadLayout packed{inner, hd}, in_qkv{3 * inner, hd};
  const float* rope = rope_.data<float>();
  for (int64_t l = L - 1; l >= 0; --l) {
    const Block& b = blocks_[size_t(l)];
    const BlockActivations& a = acts_[size_t(l)];
    // The MLP: x_out = x_mid + fc1(gelu(fc0(N1(x_mid)))); d_x is d x_out.
    add_bias_grad(b.fc1_bias, d_x, n, D);
    gelu_forward(Gelu::Tanh, a.pre_gelu, n * I, work);
    b.fc1.backward_weight(work, d_x, n, precision);
    b.fc1.backward_input(d_x, n, work, precision);
    gelu_backward(Gelu::Tanh, a.pre_gelu, work, n * I, work);
    add_bias_grad(b.fc0_bias, work, n, I);
    b.fc0.backward_weight(a.normed1, work, n, precision);
    b.fc0.backward_input(work, n, work2, precision);
    b.norm1.backward(norm, a.x_mid, n, D, a.stats1, work2, d_x, true, workspace);
    // The attention: x_mid = x_in + wo(attn(rot q, rot k, v)); d_x is now d x_mid.
    add_bias_grad(b.wo_bias, d_x, n, D);
    b.wo.backward_weight(a.attn, d_x, n, precision);
    b.wo.backward_input(d_x, n, work, precision);  // d attn [n, inner]
    float* d_q = work2;
    float* d_k = d_q + n * inner;
    float* d_v = d_k + n * inner;
    attention_backward(dims, batch, starts_.data(), starts_.data(), a.q, a.k, a.v, a.attn, a.lse, work, d_q, d_k, d_v,
                       workspace);
    float* d_qkv = work;  // [n, 3·inner]; d attn is read no more
    rope_backward(rope, n, H, hd, d_q, packed, d_qkv, in_qkv);
    rope_backward(rope, n, H, hd, d_k, packed, d_qkv + inner, in_qkv);
    copy_heads(d_v, packed, n, H, hd, d_qkv + 2 * inner, in_qkv);
    add_bias_grad(b.wqkv_bias, d_qkv, n, 3 * inner);
    b.wqkv.backward_weight(a.normed0, d_qkv, n, precision);
    b.wqkv.backward_input(d_qkv, n, work2, precision);
    b.norm0.backward(norm, a.x_in, n, D, a.stats0, work2, d_x, true, workspace);
  }

  // The patch embedding and the learned positions (through the resize's transpose).
  for (int64_t i = 0; i < batch; ++i) {
    const TowerImage& img = saved_images_[size_t(i)];
    const int64_t rows = img.grid_rows * img.grid_cols;
    const float* g = d_x + starts_[size_t(i)] * D;
    add_bias_grad(patch_bias_, g, rows, D);
    patch_embed_.backward_weight(img.patches, g, rows, precision);
    resample_grid_backward(c.pos_emb_resample, g, img.grid_rows, img.grid_cols, D, pos_emb_->g(), c.pos_emb_height,
                           c.pos_emb_width);
  }
}

}  // namespace hyla
