#include "hyla/core/tensor.h"

#include <cstring>

#include "hyla/core/memory.h"

namespace hyla {

Shape::Shape(std::initializer_list<int64_t> dims) {
  for (int64_t d : dims) push_back(d);
}

void Shape::push_back(int64_t d) {
  HYLA_CHECK(ndim_ < kMaxDims, "tensor shape has more than {} dims", kMaxDims);
  HYLA_CHECK(d >= 0, "tensor dim {} is negative", d);
  dims_[ndim_++] = d;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= dims_[i];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (ndim_ != o.ndim_) return false;
  for (int i = 0; i < ndim_; ++i)
    if (dims_[i] != o.dims_[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < ndim_; ++i) s += (i ? ", " : "") + std::to_string(dims_[i]);
  return s + "]";
}

Tensor Tensor::empty(DType dtype, const Shape& shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  auto memory = allocate_aligned(t.nbytes());
  t.data_ = memory.get();
  t.owner_ = std::move(memory);
  return t;
}

Tensor Tensor::zeros(DType dtype, const Shape& shape) {
  Tensor t = empty(dtype, shape);
  std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::view(DType dtype, const Shape& shape, void* data, std::shared_ptr<const void> owner) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.data_ = data;
  t.owner_ = std::move(owner);
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  HYLA_CHECK(shape.numel() == numel(), "cannot reshape {} to {}", shape_.str(), shape.str());
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  HYLA_CHECK(shape_.ndim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0],
             "rows [{}, {}) out of range for shape {}", begin, end, shape_.str());
  Shape s;
  s.push_back(end - begin);
  for (int i = 1; i < shape_.ndim(); ++i) s.push_back(shape_[i]);
  const size_t row_bytes = shape_[0] ? nbytes() / size_t(shape_[0]) : 0;
  return view(dtype_, s, static_cast<char*>(data_) + size_t(begin) * row_bytes, owner_);
}

Tensor Tensor::clone() const {
  Tensor t = empty(dtype_, shape_);
  std::memcpy(t.data_, data_, nbytes());
  return t;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return clone();
  Tensor out = empty(dtype, shape_);
  const size_t n = size_t(numel());
  auto floating = [](DType d) { return d == DType::F32 || d == DType::BF16 || d == DType::F16; };
  HYLA_CHECK(floating(dtype_) && floating(dtype), "cannot convert {} to {}", dtype_name(dtype_),
             dtype_name(dtype));
  if (dtype_ == DType::F32) {
    if (dtype == DType::BF16) convert(data<float>(), out.data<bf16>(), n);
    else convert(data<float>(), out.data<f16>(), n);
    return out;
  }
  Tensor f32 = dtype == DType::F32 ? out : empty(DType::F32, shape_);
  if (dtype_ == DType::BF16) convert(data<bf16>(), f32.data<float>(), n);
  else convert(data<f16>(), f32.data<float>(), n);
  return dtype == DType::F32 ? out : f32.to(dtype);
}

void Tensor::fail_dtype(DType expected) const {
  fail("tensor holds {} but was read as {}", dtype_name(dtype_), dtype_name(expected));
}

}  // namespace hyla
