// Tensor storage, views and copies (see tensor.h).
#include "reference/tensor.h"

#include <cassert>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

namespace attest {

Shape Tensor::ContiguousStrides(const Shape& shape) {
  Shape strides(shape.size(), 1);
  int64_t s = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = s;
    s *= shape[d];
  }
  return strides;
}

int64_t Tensor::NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    assert(d >= 0);
    n *= d;
  }
  return n;
}

Tensor Tensor::Zeros(DType dtype, Shape shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.strides_ = ContiguousStrides(shape);
  t.shape_ = std::move(shape);
  // At least one byte so that an empty tensor is still `defined()`.
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(t.numel() * SizeOf(dtype), 1));
  // calloc, not value-initialisation: a large block comes as fresh zero pages from mmap
  // (glibc does not clear those again), so its pages are touched first by whoever writes the
  // tensor, not by a memset beforehand.
  auto* zeros = static_cast<std::byte*>(std::calloc(bytes, 1));
  if (zeros == nullptr) throw std::bad_alloc();
  t.storage_ = std::shared_ptr<std::byte[]>(zeros, [](std::byte* p) { std::free(p); });
  t.base_ = t.storage_.get();
  return t;
}

Tensor Tensor::FromF64(Shape shape, std::vector<double> values) {
  Tensor t = Zeros(DType::kF64, std::move(shape));
  if (static_cast<int64_t>(values.size()) != t.numel()) {
    throw std::invalid_argument("Tensor::FromF64: " + std::to_string(values.size()) +
                                " values for " + t.Describe());
  }
  if (!values.empty()) std::memcpy(t.base_, values.data(), values.size() * sizeof(double));
  return t;
}

Tensor Tensor::View(DType dtype, Shape shape, Shape strides, void* data) {
  assert(shape.size() == strides.size());
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.strides_ = std::move(strides);
  t.base_ = static_cast<std::byte*>(data);
  return t;
}

bool Tensor::contiguous() const { return strides_ == ContiguousStrides(shape_) || numel() <= 1; }

int64_t Tensor::Offset(std::span<const int64_t> index) const {
  assert(index.size() == shape_.size());
  int64_t off = 0;
  for (size_t d = 0; d < index.size(); ++d) {
    assert(index[d] >= 0 && index[d] < shape_[d]);
    off += index[d] * strides_[d];
  }
  return off;
}

Tensor Tensor::Select(int64_t dim, int64_t index) const {
  const auto d = static_cast<size_t>(dim);
  assert(d < shape_.size() && index >= 0 && index < shape_[d]);
  Tensor t = *this;
  t.base_ = base_ + index * strides_[d] * SizeOf(dtype_);
  t.shape_.erase(t.shape_.begin() + dim);
  t.strides_.erase(t.strides_.begin() + dim);
  return t;
}

Tensor Tensor::Narrow(int64_t dim, int64_t start, int64_t length) const {
  const auto d = static_cast<size_t>(dim);
  assert(d < shape_.size() && start >= 0 && length >= 0 && start + length <= shape_[d]);
  Tensor t = *this;
  if (length > 0) t.base_ = base_ + start * strides_[d] * SizeOf(dtype_);
  t.shape_[d] = length;
  return t;
}

Tensor Tensor::Permute(const std::vector<int64_t>& order) const {
  assert(order.size() == shape_.size());
  Tensor t = *this;
  for (size_t d = 0; d < order.size(); ++d) {
    t.shape_[d] = shape_[static_cast<size_t>(order[d])];
    t.strides_[d] = strides_[static_cast<size_t>(order[d])];
  }
  return t;
}

Tensor Tensor::Reshape(Shape shape) const {
  CheckContiguous();
  if (NumElements(shape) != numel()) {
    throw std::invalid_argument("Tensor::Reshape: element count differs for " + Describe());
  }
  Tensor t = *this;
  t.strides_ = ContiguousStrides(shape);
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::Clone() const {
  Tensor t = Zeros(dtype_, shape_);
  t.CopyFrom(*this);
  return t;
}

void Tensor::CopyFrom(const Tensor& src) const {
  if (src.dtype_ != dtype_ || src.shape_ != shape_) {
    throw std::invalid_argument("Tensor::CopyFrom: " + src.Describe() + " into " + Describe());
  }
  const int64_t size = SizeOf(dtype_);
  if (contiguous() && src.contiguous()) {
    if (numel() > 0) std::memcpy(base_, src.base_, static_cast<size_t>(numel() * size));
    return;
  }
  ForEachIndex(shape_, [&](std::span<const int64_t> idx) {
    std::memcpy(base_ + Offset(idx) * size, src.base_ + src.Offset(idx) * size,
                static_cast<size_t>(size));
  });
}

bool Tensor::BitwiseEqual(const Tensor& other) const {
  if (other.dtype_ != dtype_ || other.shape_ != shape_) return false;
  const int64_t size = SizeOf(dtype_);
  bool equal = true;
  ForEachIndex(shape_, [&](std::span<const int64_t> idx) {
    if (equal && std::memcmp(base_ + Offset(idx) * size, other.base_ + other.Offset(idx) * size,
                             static_cast<size_t>(size)) != 0) {
      equal = false;
    }
  });
  return equal;
}

std::string Tensor::Describe() const {
  std::string s(Name(dtype_));
  s += "[";
  for (size_t d = 0; d < shape_.size(); ++d) {
    if (d) s += ", ";
    s += std::to_string(shape_[d]);
  }
  return s + "]";
}

void Tensor::CheckElementType(size_t size) const {
  if (static_cast<int>(size) != SizeOf(dtype_)) {
    throw std::logic_error("Tensor::data<T>: element size " + std::to_string(size) +
                           " does not match " + Describe());
  }
}

void Tensor::CheckContiguous() const {
  if (!contiguous()) throw std::logic_error("Tensor: not contiguous: " + Describe());
}

}  // namespace attest
