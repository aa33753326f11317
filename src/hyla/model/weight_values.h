#pragma once
// The values a model's files hold, checked alike by every command that reads them (inspect,
// logits, generate, chat, serve, bench, eval, convert): a command refuses exactly what the others
// refuse. The rule per storage: floating-point tensors (F32, BF16, F16) finite; int8 scales finite
// and >= 0; MXFP4 scales (E8M0) not 0xFF, which is NaN; a GGUF quantised block's scales finite.
// One pass over the bytes, at the speed of reading them.
#include <string>

#include "hyla/io/safetensors.h"

namespace hyla {

// Fails, naming the file, the tensor, the index and the rule, unless tensor `name` of `weights`
// holds valid values. I8 and U8 codes are valid whatever they hold; an int8 weight's or MXFP4
// weight's scales are checked as the tensor `name`.scale.
void check_weight_values(const ModelWeights& weights, const std::string& name);

// Fails, naming `file`, the tensor `name` and the index, unless the F32, BF16 or F16 tensor `t`
// (as fetched from the file) is finite.
void check_float_values(const Tensor& t, const std::string& file, const std::string& name);

// The first non-finite element of n values of dtype F32, BF16 or F16 at data, or -1.
int64_t first_non_finite(const void* data, DType dtype, int64_t n);

}  // namespace hyla
