#include "hyla/kernels/kda.h"

#include <omp.h>

#include <algorithm>
#include <numeric>
#include <span>

#include "hyla/core/error.h"
#include "hyla/core/memory.h"
#include "hyla/core/simd.h"
#include "hyla/kernels/cpu/kda_internal.h"

namespace hyla {

const char* to_string(KdaPath p) {
  switch (p) {
    case KdaPath::Recurrent: return "recurrent";
    case KdaPath::ChunkedDense: return "dense";
    case KdaPath::ChunkedPairwise: return "pairwise";
  }
  return "?";
}

namespace {

void check(const KdaShape& shape, const KdaInputs& in, const KdaOptions& options) {
  HYLA_CHECK(shape.heads > 0 && shape.key_dim > 0 && shape.value_dim > 0, "kda: bad shape H={} K={} V={}",
             shape.heads, shape.key_dim, shape.value_dim);
  HYLA_CHECK(options.chunk_size >= 16 && options.chunk_size % 16 == 0 && options.chunk_size <= 256,
             "kda: chunk_size {} must be a multiple of 16 in [16, 256]", options.chunk_size);
  HYLA_CHECK(in.batch >= 0 && (in.batch == 0 || in.starts), "kda: bad batch");
  for (int64_t b = 0; b < in.batch; ++b)
    HYLA_CHECK(in.starts[b + 1] >= in.starts[b], "kda: sequence {} has negative length", b);
}

// (sequence, head, columns) tasks, longest sequences first so that dynamic scheduling balances
// them. With fewer (sequence, head) pairs than threads, each pair's state columns are split
// (in multiples of 16) so that every thread has work.
std::span<const KdaTask> tasks(const KdaShape& shape, const KdaInputs& in, int64_t& splits, Frame& frame) {
  int64_t* const order = frame.take<int64_t>(in.batch);
  std::iota(order, order + in.batch, 0);
  std::stable_sort(order, order + in.batch, [&](int64_t a, int64_t b) {
    return in.starts[a + 1] - in.starts[a] > in.starts[b + 1] - in.starts[b];
  });
  const int64_t pairs = in.batch * shape.heads, threads = omp_get_max_threads();
  splits = pairs >= threads ? 1 : std::clamp<int64_t>(ceil_div(threads, pairs), 1, ceil_div(shape.value_dim, 16));
  const int64_t width = ceil_div(ceil_div(shape.value_dim, splits), 16) * 16;
  splits = ceil_div(shape.value_dim, width);
  KdaTask* const list = frame.take<KdaTask>(in.batch * shape.heads * splits);
  int64_t n = 0;
  for (int64_t i = 0; i < in.batch; ++i)
    for (int64_t h = 0; h < shape.heads; ++h)
      for (int64_t v0 = 0; v0 < shape.value_dim; v0 += width)
        list[n++] = {order[i], h, v0, std::min(width, shape.value_dim - v0), v0 / width};
  return {list, size_t(n)};
}

// Flush-to-zero and denormals-are-zero for the kernel's duration: decayed products can fall
// into the denormal range, where x86 arithmetic is ~100x slower; their values are negligible.
class FlushDenormals {
 public:
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040); }
  ~FlushDenormals() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
};

}  // namespace

float kda_forward(const KdaShape& shape, const KdaInputs& in, const KdaOptions& options, float* o,
                  float* const* final_states, KdaSavedStates* saved, Workspace& workspace) {
  check(shape, in, options);
  workspace.reserve();
  if (saved) {
    const int64_t C = options.chunk_size;
    saved->chunk_base.assign(size_t(in.batch) + 1, 0);
    for (int64_t b = 0; b < in.batch; ++b)
      saved->chunk_base[size_t(b) + 1] = saved->chunk_base[size_t(b)] + ceil_div(in.starts[b + 1] - in.starts[b], C);
    const int64_t chunks = saved->chunk_base.back();
    const Shape needed{std::max<int64_t>(chunks, 1), shape.heads, shape.key_dim, shape.value_dim};
    if (!(saved->states.defined() && saved->states.numel() >= needed.numel()))
      saved->states = Tensor::empty(DType::F32, needed);
  }
  Frame frame(workspace.serial());
  int64_t splits = 1;
  const auto list = tasks(shape, in, splits, frame);
  float max_exponent = 0.0f;
#pragma omp parallel reduction(max : max_exponent)
  {
    FlushDenormals flush;
    Arena& ws = workspace.thread(omp_get_thread_num());
#pragma omp for schedule(dynamic, 1)
    for (size_t i = 0; i < list.size(); ++i) {
      const Frame task(ws);
      if (options.path == KdaPath::Recurrent)
        kda_recurrent_forward_task(shape, in, options, list[i], o, final_states, saved, ws);
      else
        max_exponent =
            std::max(max_exponent, kda_chunked_forward_task(shape, in, options, list[i], o, final_states, saved, ws));
    }
  }
  return max_exponent;
}

void kda_backward(const KdaShape& shape, const KdaInputs& in, const KdaOptions& options, const float* d_o,
                  const float* const* d_final_states, const KdaSavedStates& saved, const KdaGrads& grads,
                  Workspace& workspace) {
  check(shape, in, options);
  HYLA_CHECK(saved.chunk_base.size() == size_t(in.batch) + 1, "kda: backward needs the states of its forward");
  workspace.reserve();
  Frame frame(workspace.serial());
  int64_t splits = 1;
  const auto list = tasks(shape, in, splits, frame);
  // Split tasks write their partial dq, dk, dg, dβ into per-split buffers, summed afterwards.
  const int64_t rows = in.batch ? in.starts[in.batch] : 0, nqk = rows * shape.heads * shape.key_dim,
                nb = rows * shape.heads;
  float* const partials = splits > 1 ? frame.take<float>(splits * (3 * nqk + nb)) : nullptr;
  auto grads_of = [&](const KdaTask& task) {
    if (splits == 1) return grads;
    float* base = partials + task.split * (3 * nqk + nb);
    return KdaGrads{base, base + nqk, grads.dv, base + 2 * nqk, base + 3 * nqk, grads.d_initial_states};
  };
#pragma omp parallel
  {
    FlushDenormals flush;
    Arena& ws = workspace.thread(omp_get_thread_num());
#pragma omp for schedule(dynamic, 1)
    for (size_t i = 0; i < list.size(); ++i) {
      const Frame task(ws);
      const KdaGrads task_grads = grads_of(list[i]);
      if (options.path == KdaPath::Recurrent)
        kda_recurrent_backward_task(shape, in, options, list[i], d_o, d_final_states, saved, task_grads, ws);
      else
        kda_chunked_backward_task(shape, in, options, list[i], d_o, d_final_states, saved, task_grads, ws);
    }
    if (splits > 1) {
      float* outputs[4] = {grads.dq, grads.dk, grads.dg, grads.dbeta};
      const int64_t offsets[4] = {0, nqk, 2 * nqk, 3 * nqk}, sizes[4] = {nqk, nqk, nqk, nb};
      for (int which = 0; which < 4; ++which) {
#pragma omp for schedule(static)
        for (int64_t x = 0; x < sizes[which]; ++x) {
          float sum = 0.0f;
          for (int64_t s = 0; s < splits; ++s) sum += partials[s * (3 * nqk + nb) + offsets[which] + x];
          outputs[which][x] = sum;
        }
      }
    }
  }
}

std::vector<float*> kda_state_pointers(float* states, int64_t batch, const KdaShape& shape) {
  std::vector<float*> pointers(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) pointers[size_t(b)] = states + b * shape.heads * shape.key_dim * shape.value_dim;
  return pointers;
}

KdaPath kda_fastest_path(int64_t key_dim, int64_t value_dim, bool backward, bool bf16_matmul, bool lower_bounded_gate) {
  const int64_t dim = std::max(key_dim, value_dim);
  const KdaPath chunked = lower_bounded_gate ? KdaPath::ChunkedDense : KdaPath::ChunkedPairwise;
  if (backward) return !lower_bounded_gate && dim <= 64 ? KdaPath::Recurrent : chunked;
  return dim <= (bf16_matmul ? 64 : 128) ? KdaPath::Recurrent : chunked;
}

namespace {
// Σ over 16-row blocks of a lower-triangular product's contraction lengths: Σ_a rows_a · (r0_a + rows_a).
double lower_block_pairs(int64_t L) {
  double s = 0;
  for (int64_t r0 = 0; r0 < L; r0 += 16) {
    const int64_t rows = std::min<int64_t>(16, L - r0);
    s += double(rows) * double(r0 + rows);
  }
  return s;
}
}  // namespace

double kda_forward_flops(KdaPath path, int64_t tokens, int64_t K, int64_t V, int64_t chunk) {
  const double k = double(K), v = double(V);
  if (path == KdaPath::Recurrent) return double(tokens) * 7.0 * k * v;  // decay, S̃ᵀk, S̃ᵀq, update
  double total = 0;
  for (int64_t t0 = 0; t0 < tokens; t0 += chunk) {
    const double L = double(std::min(chunk, tokens - t0)), lower = lower_block_pairs(int64_t(L));
    total += 2 * 2 * lower * k   // [P ; Ã] (both paths count the dense product; pairwise does its diagonal by pairs)
             + L * L * L / 3      // T by substitution
             + 2 * lower * (k + v)  // W, U
             + 2 * L * k * v * 3    // E, Q̂ S0, state update
             + 2 * lower * v;       // P E
  }
  return total;
}

double kda_backward_flops(KdaPath path, int64_t tokens, int64_t K, int64_t V, int64_t chunk) {
  const double k = double(K), v = double(V);
  if (path == KdaPath::Recurrent) {
    // Recompute (pending update, decay, S̃ᵀk: 5 K·V) plus the two reverse passes (10 + 8 K·V).
    return double(tokens) * 23.0 * k * v;
  }
  double total = kda_forward_flops(path, tokens, K, V, chunk);  // recomputation
  for (int64_t t0 = 0; t0 < tokens; t0 += chunk) {
    const double L = double(std::min(chunk, tokens - t0)), lower = lower_block_pairs(int64_t(L));
    total += 2 * L * k * v * 6        // dE, dKt, [dQ̂;dW] (2L), dS0 (2L)
             + 2 * L * L * v * 2      // dP, Pᵀ dO
             + 2 * L * L * (k + v) * 2  // dX, dT
             + 2 * L * L * L * 2      // dA
             + 2 * 2 * lower * k * 2;  // through [P ; Ã]
  }
  return total;
}

}  // namespace hyla
