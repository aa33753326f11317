#pragma once
// Buffers a layer keeps between calls (saved activations, work space): grown to the largest size
// seen and then reused, so steady-state steps allocate nothing.
#include <algorithm>
#include <cstdint>

#include "hyla/core/tensor.h"

namespace hyla {

// At least `numel` elements of `buffer` (contents unspecified after growing).
template <typename T>
T* grow_buffer(Tensor& buffer, int64_t numel) {
  if (!buffer.defined() || buffer.dtype() != dtype_of<T>() || buffer.numel() < numel)
    buffer = Tensor::empty(dtype_of<T>(), {std::max<int64_t>(numel, 1)});
  return buffer.data<T>();
}

}  // namespace hyla
