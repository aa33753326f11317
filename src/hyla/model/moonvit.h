#pragma once
// MoonViT, the vision tower of Kimi K2.5 and Kimi K3, with its projector (SPEC §7.2): an image's
// normalised patches in, one row of the language model's width out per merge×merge patches.
//
// What crosses: TowerImage (a grid of patches, each channel-first as the checkpoint's patch
// convolution reads it) and plain output rows. The weights live in the caller's ParamStore under
// the checkpoint's own names (vision_tower.*, mm_projector.*), so HF, GGUF and model directories
// name them alike; the patch convolution [D, C, P, P] is held as the matrix [D, C·P·P].
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hyla/core/image.h"
#include "hyla/core/tensor.h"
#include "hyla/model/config.h"
#include "hyla/model/context.h"
#include "hyla/model/layers.h"
#include "hyla/model/params.h"

namespace hyla {

struct TowerImage {
  int64_t grid_rows = 0, grid_cols = 0;  // patches; multiples of merge
  // [grid_rows·grid_cols, C·P·P]: patches row-major over the grid, each channel-first (c, y, x),
  // normalised as SPEC §7.2 says.
  const float* patches = nullptr;
};

// An image as the tower reads it (SPEC §7.2; data/moonvit_image.h makes one): RGB, sides multiples
// of merge·P. Writes its patches into out [rows·cols, 3·P·P], each value (x/255 − mean)/std,
// channel-first, and returns the grid. The failure names `source`.
TowerImage moonvit_patchify(const Image& image, const VisionConfig& vision, std::string_view source, float* out);

class MoonVit {
 public:
  // Registers the tower's and projector's parameters in `store` (Component::Vision): the options
  // of vision.moonvit, vision's patch size and channels, rows of `text_hidden` values out.
  MoonVit(ParamStore& store, const VisionConfig& vision, int64_t text_hidden);
  int64_t patch_values() const { return patch_values_; }  // C·P·P, a patch's values

  // Output rows an image gives: (grid_rows / merge)·(grid_cols / merge).
  int64_t tokens(const TowerImage& image) const;
  // The projector's rows of every image, in order, into out [Σ tokens, text_hidden_size]. Images
  // attend only within themselves. Scratch grows to the largest call and is kept. With `save`,
  // every block keeps its activations (and `images` must stay valid) for backward().
  void forward(std::span<const TowerImage> images, float* out, Precision precision, Workspace& workspace,
               bool save = false);
  // Given d_out [Σ tokens, text_hidden_size] for the last saved forward, adds every parameter's
  // gradient (the pixels have none).
  void backward(const float* d_out, Workspace& workspace);

 private:
  struct Norm {  // LayerNorm (weight, bias) or RMSNorm (weight) as the config says
    Param* weight = nullptr;
    Param* bias = nullptr;
    // stats: [rows, 2] (LayerNorm's mean and 1/σ; RMSNorm uses the first rows values for 1/rms).
    void forward(VisionNorm kind, const float* x, int64_t rows, int64_t dim, float eps, float* y,
                 float* stats) const;
    // dx (= or += when accumulate) from dy; adds to the weight's (and bias's) gradient.
    void backward(VisionNorm kind, const float* x, int64_t rows, int64_t dim, const float* stats,
                  const float* dy, float* dx, bool accumulate, Workspace& workspace) const;
  };
  // One block's activations: its own buffers when saving, the shared scratch otherwise.
  struct BlockActivations {
    float *x_in, *stats0, *normed0, *q, *k, *v, *attn, *lse, *x_mid, *stats1, *normed1, *pre_gelu;
  };
  struct Block {
    Norm norm0, norm1;
    Linear wqkv, wo, fc0, fc1;
    Param *wqkv_bias = nullptr, *wo_bias = nullptr, *fc0_bias = nullptr, *fc1_bias = nullptr;
  };
  Norm make_norm(ParamStore& store, const std::string& name, int64_t dim, bool with_bias) const;
  Param* make_bias(ParamStore& store, const std::string& name, int64_t dim, bool present) const;

  MoonVitConfig config_;
  int64_t patch_values_ = 0, text_hidden_ = 0;
  Linear patch_embed_;
  Param* patch_bias_ = nullptr;
  Param* pos_emb_ = nullptr;  // [pos_emb_height, pos_emb_width, D]
  std::vector<Block> blocks_;
  Norm final_norm_;
  Norm pre_norm_;   // PatchMerger: per patch, before the merge's concatenation
  Linear proj0_, proj2_;
  Param *proj0_bias_ = nullptr, *proj2_bias_ = nullptr;
  Norm post_norm_;  // PatchMergerV2: RMSNorm over the output

  // Activations (one arena, carved per block when saving) and scratch, grown to the largest call.
  Tensor arena_, rope_, pos_, scratch_;
  std::vector<BlockActivations> acts_;
  float *x_final_ = nullptr, *stats_final_ = nullptr, *normed_final_ = nullptr;  // final norm's input, stats, output
  float *merged_raw_ = nullptr, *stats_pre_ = nullptr, *merged_ = nullptr;     // the merge, before and after pre_norm
  float *pre_gelu_proj_ = nullptr, *post_gelu_proj_ = nullptr, *out_pre_ = nullptr, *stats_post_ = nullptr;
  std::vector<int64_t> starts_, patch_rows_, patch_cols_;
  std::vector<TowerImage> saved_images_;
  int64_t patches_ = 0, out_rows_ = 0;
  Precision precision_ = Precision::F32;
  bool saved_ = false;
};

}  // namespace hyla
