#pragma once
// What the CPU backend finds at run time about the instructions it may use; only the CPU
// kernels ask (the op headers' *_use_* functions answer the model's questions).

namespace hyla {

// Whether the kernels' bf16 products (AttentionDims and LatentAttentionDims::bf16_products) run
// on bf16 dot-product instructions here. Without them they are emulated with two f32
// multiply-adds per pair after rounding to bf16: slower than the f32 products and less exact, so
// attention_use_bf16_products and latent_attention_use_bf16_products choose them only where this
// is true.
bool native_bf16_products();

// Whether AMX tile products run here: compiled for AMX-BF16 and granted by the kernel, which a
// process must ask for its tile state (arch_prctl ARCH_REQ_XCOMP_PERM); asked once. A tile
// product multiplies 16×32 by 32×16 bf16 in one instruction: on the 2-core Xeon of BENCHMARKS.md,
// 3.2 TFLOP/s a core, 30× vdpbf16ps's 108 GFLOP/s.
bool amx_tiles();

}  // namespace hyla
