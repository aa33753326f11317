#include "hyla/kernels/matmul.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <vector>
#include <cstring>
#include <memory>
#include <type_traits>
#include <unordered_map>

#include "hyla/core/error.h"
#include "hyla/core/half.h"
#include "hyla/core/memory.h"
#include "hyla/core/threads.h"
#include "hyla/core/team.h"
#include "hyla/kernels/skinny_gemm.h"

namespace hyla {
namespace {

struct GemmKey {
  bool bf16_inputs;
  Trans ta, tb;
  int64_t batch, M, N, K, lda, ldb, ldc, stride_a, stride_b, stride_c;
  float alpha, beta;
  // oneDNN splits a product's work among the threads there are when the primitive is created and
  // keeps that split: one created on 1 thread runs on 1 thread ever after, whatever the caller's
  // count (bench -t 1,2; adaptive threads that drop and come back).
  int threads;
  bool operator==(const GemmKey&) const = default;
};

struct GemmKeyHash {
  size_t operator()(const GemmKey& k) const {
    size_t h = std::hash<int64_t>()(k.M);
    auto mix = [&h](uint64_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    for (int64_t v : {k.batch, k.N, k.K, k.lda, k.ldb, k.ldc, k.stride_a, k.stride_b, k.stride_c}) mix(uint64_t(v));
    uint32_t a, b;
    std::memcpy(&a, &k.alpha, 4);
    std::memcpy(&b, &k.beta, 4);
    mix(a);
    mix(b);
    mix(uint64_t(k.bf16_inputs) | uint64_t(k.ta) << 1 | uint64_t(k.tb) << 2 | uint64_t(k.threads) << 3);
    return h;
  }
};

// One entry per shape and per calling thread: the memory objects and argument map are reused
// (only their data handles change), so a call allocates nothing.
struct CachedGemm {
  dnnl::matmul primitive;
  dnnl::memory a, b, c, scratchpad;
  std::unordered_map<int, dnnl::memory> args;
  // bf16 inputs on a CPU oneDNN has no bf16 matmul for (before AVX-512, e.g. AMD Zen 2/3): the
  // primitive is the f32 one and each call widens the inputs first (exact: every bf16 is an f32).
  bool widen = false;
};

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

std::atomic<int64_t> primitives_created{0};

// Scratchpad owned by the calling thread and grown, never shrunk.
void* scratchpad(size_t bytes) {
  thread_local std::shared_ptr<void> buffer;
  thread_local size_t capacity = 0;
  if (bytes > capacity) {
    buffer = allocate_aligned(bytes);
    capacity = bytes;
  }
  return buffer.get();
}

CachedGemm create(const GemmKey& key) {
  using dt = dnnl::memory::data_type;
  const dt input = key.bf16_inputs ? dt::bf16 : dt::f32;
  const bool batched = key.batch > 1 || key.stride_a || key.stride_b || key.stride_c;
  auto matrix = [&](int64_t rows, int64_t cols, Trans t, int64_t ld, int64_t stride, dt type) {
    // op(X)[r, c] lives at X[r * ld + c] (N) or X[c * ld + r] (T).
    const int64_t row_stride = t == Trans::N ? ld : 1, col_stride = t == Trans::N ? 1 : ld;
    if (!batched) return dnnl::memory::desc({rows, cols}, type, {row_stride, col_stride});
    return dnnl::memory::desc({key.batch, rows, cols}, type, {stride, row_stride, col_stride});
  };
  const auto a = matrix(key.M, key.K, key.ta, key.lda, key.stride_a, input);
  const auto b = matrix(key.K, key.N, key.tb, key.ldb, key.stride_b, input);
  const auto c = matrix(key.M, key.N, Trans::N, key.ldc, key.stride_c, dt::f32);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (key.alpha != 1.0f) attr.set_output_scales(0, {key.alpha});
  if (key.beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(key.beta);
    attr.set_post_ops(ops);
  }
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, cpu_engine());
  } catch (const dnnl::error&) {
    if (!key.bf16_inputs) throw;
    GemmKey f32 = key;
    f32.bf16_inputs = false;
    CachedGemm g = create(f32);
    g.widen = true;
    return g;
  }
  dnnl::engine& engine = cpu_engine();
  CachedGemm g{dnnl::matmul(pd), dnnl::memory(a, engine, nullptr), dnnl::memory(b, engine, nullptr),
               dnnl::memory(c, engine, nullptr), dnnl::memory(pd.scratchpad_desc(), engine, nullptr), {}};
  g.args = {{DNNL_ARG_SRC, g.a}, {DNNL_ARG_WEIGHTS, g.b}, {DNNL_ARG_DST, g.c}};
  if (pd.scratchpad_desc().get_size() > 0) g.args.emplace(DNNL_ARG_SCRATCHPAD, g.scratchpad);
  ++primitives_created;
  return g;
}

// The values a matrix argument spans in memory: op(X) is rows × cols, `batch` of them `stride` apart.
int64_t span_values(int64_t batch, int64_t rows, int64_t cols, Trans t, int64_t ld, int64_t stride) {
  const int64_t stored_rows = t == Trans::N ? rows : cols, stored_cols = t == Trans::N ? cols : rows;
  return (batch - 1) * stride + (stored_rows - 1) * ld + stored_cols;
}

// `n` bf16 values widened into a buffer of the calling thread (`slot` 0 or 1), grown, never shrunk.
const float* widened(const void* values, int64_t n, int slot) {
  thread_local std::shared_ptr<void> buffers[2];
  thread_local size_t capacity[2] = {0, 0};
  const size_t bytes = size_t(n) * sizeof(float);
  if (bytes > capacity[slot]) {
    buffers[slot] = allocate_aligned(bytes);
    capacity[slot] = bytes;
  }
  float* out = static_cast<float*>(buffers[slot].get());
  convert(static_cast<const bf16*>(values), out, size_t(n));
  return out;
}

void run(const GemmKey& key, const void* A, const void* B, float* C) {
  if (key.M == 0 || key.N == 0 || key.batch == 0) return;
  if (key.K == 0) {  // empty sum: C = beta * C
    for (int64_t b = 0; b < key.batch; ++b)
      for (int64_t i = 0; i < key.M; ++i) {
        float* row = C + b * key.stride_c + i * key.ldc;
        for (int64_t j = 0; j < key.N; ++j) row[j] = key.beta == 0.0f ? 0.0f : key.beta * row[j];
      }
    return;
  }
  thread_local std::unordered_map<GemmKey, CachedGemm, GemmKeyHash> cache;
  thread_local dnnl::stream stream(cpu_engine());
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, create(key)).first;
  CachedGemm& g = it->second;
  if (g.widen) {
    A = widened(A, span_values(key.batch, key.M, key.K, key.ta, key.lda, key.stride_a), 0);
    B = widened(B, span_values(key.batch, key.K, key.N, key.tb, key.ldb, key.stride_b), 1);
  }
  g.a.set_data_handle(const_cast<void*>(A));
  g.b.set_data_handle(const_cast<void*>(B));
  g.c.set_data_handle(C);
  if (g.args.count(DNNL_ARG_SCRATCHPAD)) g.scratchpad.set_data_handle(scratchpad(g.scratchpad.get_desc().get_size()));
  g.primitive.execute(stream, g.args);
  stream.wait();
}

GemmKey make_key(bool bf16_inputs, int64_t batch, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K,
                 float alpha, int64_t lda, int64_t stride_a, int64_t ldb, int64_t stride_b, float beta,
                 int64_t ldc, int64_t stride_c) {
  HYLA_ASSERT(M >= 0 && N >= 0 && K >= 0 && batch >= 0);
  HYLA_ASSERT(lda >= (ta == Trans::N ? K : M) && ldb >= (tb == Trans::N ? N : K) && ldc >= N);
  return {bf16_inputs, ta, tb, batch, M, N, K, lda, ldb, ldc, stride_a, stride_b, stride_c, alpha, beta, num_threads()};
}

// One rule for both input types: a few rows against a transposed B (x · Wᵀ, decoding) go to
// skinny_gemm, which streams W once in its stored layout; everything else to oneDNN.
template <typename T>
void dispatch_gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda,
                   const T* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (ta == Trans::N && tb == Trans::T && M <= kSkinnyMaxRows)
    return skinny_gemm(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  run(make_key(std::is_same_v<T, bf16>, 1, ta, tb, M, N, K, alpha, lda, 0, ldb, 0, beta, ldc, 0), A, B, C);
}

}  // namespace

void gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  dispatch_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
          const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  dispatch_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_batched(int64_t batch, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, int64_t stride_a, const float* B, int64_t ldb,
                  int64_t stride_b, float beta, float* C, int64_t ldc, int64_t stride_c) {
  // A few rows per product (decode's per-head products): the products split across the threads,
  // each streaming its B once on the skinny kernels (one oneDNN call on one thread took ~10 µs of a
  // decoded token's serial time per latent-attention layer).
  if (ta == Trans::N && M <= kSkinnyMaxRows) {
    parallel_for(batch, 1, [&](int, int64_t first, int64_t last) {
      for (int64_t b = first; b < last; ++b) {
        const float *a = A + b * stride_a, *w = B + b * stride_b;
        float* c = C + b * stride_c;
        if (tb == Trans::T) skinny_gemm(M, N, K, alpha, a, lda, w, ldb, beta, c, ldc);
        else skinny_gemm_kn(M, N, K, alpha, a, lda, w, ldb, beta, c, ldc);
      }
    });
    return;
  }
  run(make_key(false, batch, ta, tb, M, N, K, alpha, lda, stride_a, ldb, stride_b, beta, ldc, stride_c), A, B, C);
}

void gemm_batched(int64_t batch, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha,
                  const bf16* A, int64_t lda, int64_t stride_a, const bf16* B, int64_t ldb,
                  int64_t stride_b, float beta, float* C, int64_t ldc, int64_t stride_c) {
  run(make_key(true, batch, ta, tb, M, N, K, alpha, lda, stride_a, ldb, stride_b, beta, ldc, stride_c), A, B, C);
}

int64_t gemm_primitives_created() { return primitives_created.load(); }

double measure_gemm_peak_gflops(bool bf16_inputs, int repetitions, PeakClock clock) {
  constexpr int64_t n = 2048;
  std::vector<float> a(size_t(n * n), 0.5f), b(size_t(n * n), 0.25f), c(size_t(n * n));
  std::vector<bf16> ab(a.size(), to_bf16(0.5f)), bb(b.size(), to_bf16(0.25f));
  auto once = [&] {
    if (bf16_inputs) gemm(Trans::N, Trans::N, n, n, n, 1.0f, ab.data(), n, bb.data(), n, 0.0f, c.data(), n);
    else gemm(Trans::N, Trans::N, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  };
  auto seconds = [clock] {
    if (clock == PeakClock::Wall)
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9) / num_threads();
  };
  once();  // primitive creation, first touch
  double best = 1e30;
  for (int rep = 0; rep < repetitions; ++rep) {
    const double t0 = seconds();
    once();
    best = std::min(best, seconds() - t0);
  }
  return 2.0 * double(n) * double(n) * double(n) / best * 1e-9;
}

}  // namespace hyla
