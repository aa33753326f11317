#pragma once
// The kernel backend: the seam between the model and the hardware its arithmetic runs on.
//
// The op interface. A backend implements exactly these headers of this folder:
//   matmul.h (gemm, gemm_batched), small_gemm.h, skinny_gemm.h, int8_gemm.h,
//   mxfp4_gemm.h                                                               matrix products
//   norm.h, activations.h, rope.h, conv1d.h, residual.h, resample.h            per-row steps
//   layout.h                                                                   copies between layouts
//   kda.h, kda_gates.h                                                         the KDA mixer
//   attention.h, latent_attention.h                                            attention
//   attn_res.h                                                                 attention residuals
//   moe.h, balancing.h                                                         MoE routing and balancing
//   cross_entropy.h                                                            the loss
// and this header's functions; bandwidth.h (like matmul.h's measure_gemm_peak_gflops) measures
// this machine for benchmarks rather than computing a model's values. The CPU backend implements
// them in cpu/, with what only it uses: vec.h and vmath.h its SIMD helpers, kda_internal.h its
// task split, amx_tiles.h and latent_attention_amx.h its AMX tile paths. Nothing outside this
// folder includes cpu/ but the tests and benchmarks of the CPU backend's own internals.
//
// What crosses: plain host pointers with shapes and row strides (layouts as each header states
// them), small structs of those (AttentionDims, KdaInputs, Conv1dShape, ...), and a Workspace
// (core/workspace.h) for scratch that lives only for the call. What never crosses: layers,
// parameters, Tensor objects, or anything an op keeps after it returns. One place still falls
// short of that: KdaSavedStates holds a Tensor that kda_forward sizes (its chunk states belong to
// the caller, but their memory is taken inside the op).
//
// Which backend runs is chosen once, when the library is built: CMakeLists.txt compiles cpu/'s
// sources as HYLA_KERNEL_SOURCES. A second backend (CUDA) is a second implementation of
// the headers above put there instead, and it is correct when tests/test_backend_ops.cpp passes
// against it: every op on the same inputs as the double-precision reference in
// tests/reference_ops.h, within the tolerances stated there.
//
// The CPU backend's instruction set is fixed at compile time too, by the compiler's target
// (-march=native, or x86-64-v2 under HYLA_NATIVE=OFF): cpu/vec.h makes its 16-lane Vec one AVX-512
// register when __AVX512F__ is defined, two AVX2 registers with __AVX2__ and __FMA__, 16 plain
// floats otherwise, and every kernel written on
// Vec follows. The kernels with instructions of their own test their own macros and fall back to
// portable code without them: the bf16 dot products (small_gemm, skinny_gemm, attention,
// latent_attention) __AVX512BF16__, the int8 products __AVX512VNNI__, the MXFP4 products
// __AVX512F__ (f32) and __AVX512VNNI__ (int8 activations), and the latent-attention
// decode's tile products __AMX_TILE__ and __AMX_BF16__ (those also need the kernel's leave at run
// time: amx_tiles in cpu/instruction_set.h).

namespace hyla {

// The backend this process runs and the instruction set it was built for, as in
// "cpu (AVX-512 BF16 VNNI)", "cpu (AVX-512)", "cpu (AVX2)" or "cpu (portable)".
const char* kernel_backend_name();

}  // namespace hyla
