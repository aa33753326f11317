#pragma once
// A small dense tensor: up to 4 dims, contiguous row-major, owning its memory or viewing memory
// kept alive by an owner (a memory-mapped file, a larger buffer). Copies share storage.
#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "hyla/core/dtype.h"
#include "hyla/core/error.h"
#include "hyla/core/half.h"

namespace hyla {

class Shape {
 public:
  static constexpr int kMaxDims = 4;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  template <typename It>
  Shape(It begin, It end) {
    for (; begin != end; ++begin) push_back(int64_t(*begin));
  }

  int ndim() const { return ndim_; }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t numel() const;
  void push_back(int64_t d);
  const int64_t* begin() const { return dims_.data(); }
  const int64_t* end() const { return dims_.data() + ndim_; }
  bool operator==(const Shape& o) const;
  std::string str() const;  // "[8192, 512]"

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<bf16>() { return DType::BF16; }
template <> constexpr DType dtype_of<f16>() { return DType::F16; }
template <> constexpr DType dtype_of<int8_t>() { return DType::I8; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::I64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::U8; }

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(DType dtype, const Shape& shape);
  static Tensor zeros(DType dtype, const Shape& shape);
  // A view over `data`, which must stay valid while `owner` is alive.
  static Tensor view(DType dtype, const Shape& shape, void* data, std::shared_ptr<const void> owner);

  bool defined() const { return data_ != nullptr || shape_.numel() == 0; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  void* raw() { return data_; }
  const void* raw() const { return data_; }

  template <typename T> T* data() {
    if (dtype_ != dtype_of<T>()) [[unlikely]] fail_dtype(dtype_of<T>());
    return static_cast<T*>(data_);
  }
  template <typename T> const T* data() const {
    if (dtype_ != dtype_of<T>()) [[unlikely]] fail_dtype(dtype_of<T>());
    return static_cast<const T*>(data_);
  }

  Tensor reshape(const Shape& shape) const;      // same storage, same numel
  Tensor rows(int64_t begin, int64_t end) const;  // view of [begin, end) along dim 0
  Tensor to(DType dtype) const;                   // converted copy (floating types)
  Tensor clone() const;

 private:
  // The accessors' check stays inline (decode reads tensors' pointers thousands of times a token;
  // the out-of-line call was 0.8% of it), the error out of line.
  [[noreturn]] void fail_dtype(DType expected) const;
  DType dtype_ = DType::F32;
  Shape shape_;
  void* data_ = nullptr;
  std::shared_ptr<const void> owner_;
};

}  // namespace hyla
