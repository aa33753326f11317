#pragma once
// SPEC straight into plain double-precision loops, written independently of the engine: the
// layers of §3–§5 and the whole model of §2, §6 (for the tests' forward, finite-difference and
// whole-model logits checks).
#include <map>
#include <string>
#include <vector>

#include "hyla/model/config.h"
#include "hyla/model/context.h"
#include "hyla/model/model.h"

namespace hyla::test {

using ParamValues = std::map<std::string, std::vector<double>>;

// Parameter values looked up as scope + name (a layer's prefix, then the SPEC tensor name).
struct SpecWeights {
  const ParamValues* values;
  std::string scope;
  const std::vector<double>& at(const std::string& name) const { return values->at(scope + name); }
};

double sigmoid_ref(double x);
// Row r of a row-major [rows, cols] matrix times x.
double row_dot(const std::vector<double>& w, int64_t r, int64_t cols, const double* x);
// out += scale · W_down[:, lo:hi] act(W_gate[lo:hi] x, W_up[lo:hi] x) for an MLP `hidden` wide
// whose weights are prefix + "gate_proj.weight" etc. (SiTU's β and λ from m; limit > 0 clamps SwiGLU).
void add_mlp(const SpecWeights& P, const std::string& prefix, int64_t in, int64_t hidden, int64_t lo, int64_t hi,
             const MoeConfig& m, Activation act, double limit, const double* x, double scale, double* out);
std::vector<double> rmsnorm(std::vector<double> x, const std::vector<double>& w, double eps);
std::vector<double> matvec(const std::vector<double>& W, int64_t out, int64_t in, const double* x);

// §3: the KDA mixer on u [N, d] (sequences `starts`, zero initial states); w scoped at self_attn.
std::vector<double> reference_kda(const ModelConfig& c, const SpecWeights& w, const std::vector<int64_t>& starts,
                                  const std::vector<double>& u);
// §4: the latent attention mixer; w scoped at self_attn.
std::vector<double> reference_mla(const ModelConfig& cfg, LayerType type, const SpecWeights& w,
                                  const std::vector<double>& u, const TokenBatch& tokens);

// §5: the MoE FFN (w scoped at the layer: names "mlp.…") and the dense FFN.
struct MoeReference {
  std::vector<double> y;
  double aux = 0.0;
  double min_gap = 1e300;     // smallest gap between the k-th and (k+1)-th of s + b: no tie near
  std::vector<int> selected;  // [n, k]
};
MoeReference reference_moe(const ModelConfig& c, const SpecWeights& P, const std::vector<double>& u, int64_t n);
std::vector<double> reference_dense(const ModelConfig& c, const SpecWeights& P, const std::vector<double>& u,
                                    int64_t n);

// §7.2: MoonViT and its projector on one image given as its normalised patches [R·Cg, 3·P·P]
// (channel-first): the rows [tokens, d] that take its placeholders.
std::vector<double> reference_moonvit(const VisionConfig& v, int64_t d, const ParamValues& params, int64_t grid_rows,
                                      int64_t grid_cols, const std::vector<double>& patches);

// §2 + §6 (+ §7): the logits [rows, V] of the whole model for token ids over a packed batch; the
// rows holding `image_pad_id` take the images' patch embeddings, in order.
std::vector<double> reference_logits(const ModelConfig& c, const ParamValues& params, const TokenBatch& tokens,
                                     const std::vector<int32_t>& ids, const std::vector<Image>& images = {},
                                     int32_t image_pad_id = -1);

}  // namespace hyla::test
