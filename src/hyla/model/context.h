#pragma once
// What every layer's forward needs to know about the pass: the token layout (a packed batch of
// sequences), where scratch memory comes from, the matmul precision, and whether to keep
// activations for a backward.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "hyla/core/workspace.h"

namespace hyla {

// Matrix-product inputs: f32, or bf16 with f32 accumulation (SPEC: everything else stays f32).
enum class Precision : uint8_t { F32, BF16 };

// B sequences packed into `rows` token rows: sequence b owns rows [starts[b], starts[b+1]).
// positions[r] is row r's absolute position in its sequence (a cache offset plus its index):
// RoPE and the causal masks of attention use it.
struct TokenBatch {
  int64_t rows = 0;
  std::vector<int64_t> starts{0};
  std::vector<int64_t> positions;
  int64_t batch() const { return int64_t(starts.size()) - 1; }
  int64_t length(int64_t b) const { return starts[size_t(b) + 1] - starts[size_t(b)]; }
  // B sequences of T tokens each, positions from 0.
  static TokenBatch uniform(int64_t B, int64_t T);
  // Sequences of the given lengths, positions from the given offsets (0 when empty).
  static TokenBatch packed(const std::vector<int64_t>& lengths, const std::vector<int64_t>& offsets = {});
};

struct ForwardContext {
  const TokenBatch& tokens;
  // Scratch for the pass (core/workspace.h); a saving layer keeps it for its backward's scratch.
  Workspace& workspace;
  Precision precision = Precision::F32;
  bool save_for_backward = false;
  // The weight of this forward's loss in the training objective (e.g. 1 / micro-batches under
  // gradient accumulation): layers that add their own loss terms (the MoE auxiliary loss) scale
  // those terms' gradients by it.
  float loss_scale = 1.0f;
};

}  // namespace hyla
