#pragma once
// hyla's MXFP4 weight format (SPEC §8, docs/quantization.md), for routed experts' matrices: a
// weight `name` [out, in] is stored as U8 codes [out, in / 2] (E2M1, element 2i of a row in the low
// nibble of byte i, as compressed-tensors packs them) plus `name.scale`, U8 [out, in / 32]: one
// E8M0 exponent per 32 consecutive inputs, w = value(code) · 2^(e − 127). No __metadata__ is
// needed: the U8 dtype says it.
#include <cstdint>
#include <string>

#include "hyla/io/safetensors.h"

namespace hyla {

std::string mxfp4_scale_name(const std::string& weight);  // weight + ".scale"

// Fails unless no scale is 0xFF (NaN in E8M0), naming `source` and the scales tensor of `weight`.
void check_mxfp4_scales(const uint8_t* scales, int64_t n, const std::string& source, const std::string& weight);

// check_mxfp4_scales on MXFP4 weight `name` of `weights` (its scales, or its ggml blocks' scales).
void check_mxfp4_weight(const ModelWeights& weights, const std::string& name, const std::string& source);
// Packs MXFP4 weight `name` [rows, cols] of `weights` into dst (mxfp4_packed_bytes): straight from
// ggml MXFP4 blocks where the weights map them (a GGUF file; one pass, nothing allocated), else
// from its codes and scales. Fails as check_mxfp4_scales on a NaN scale (dst is then undefined).
void pack_mxfp4_weight(const ModelWeights& weights, const std::string& name, int64_t rows, int64_t cols,
                       uint8_t* dst, const std::string& source);

}  // namespace hyla
