// Tensor: dtype + shape + strides over bytes, owning (shared storage) or a view of someone
// else's memory. Strides count elements, not bytes. Low-precision floats hold raw codes;
// reference/formats widens them. Copies share storage (like torch.Tensor); Clone() copies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "reference/dtype.h"

namespace attest {

using Shape = std::vector<int64_t>;

class Tensor {
 public:
  Tensor() = default;

  // A contiguous, zero-filled, owning tensor.
  static Tensor Zeros(DType dtype, Shape shape);
  // A contiguous f64 tensor holding `values` (values.size() must equal the element count).
  static Tensor FromF64(Shape shape, std::vector<double> values);
  // A non-owning view of memory the caller keeps alive.
  static Tensor View(DType dtype, Shape shape, Shape strides, void* data);
  static Shape ContiguousStrides(const Shape& shape);
  static int64_t NumElements(const Shape& shape);

  bool defined() const { return base_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t dim(int64_t i) const { return shape_.at(static_cast<size_t>(i)); }
  int64_t numel() const { return NumElements(shape_); }
  int64_t nbytes() const { return numel() * SizeOf(dtype_); }
  bool owning() const { return storage_ != nullptr; }
  bool contiguous() const;

  // Element pointer of the first element; T must have the dtype's storage size.
  template <class T>
  T* data() const {
    CheckElementType(sizeof(T));
    return reinterpret_cast<T*>(base_);
  }
  std::byte* bytes() const { return base_; }
  // All elements of a contiguous tensor.
  template <class T>
  std::span<T> span() const {
    CheckContiguous();
    return {data<T>(), static_cast<size_t>(numel())};
  }
  // Element offset (in elements) of a full index.
  int64_t Offset(std::span<const int64_t> index) const;
  template <class T>
  T& at(std::initializer_list<int64_t> index) const {
    return data<T>()[Offset({index.begin(), index.size()})];
  }

  // Views sharing storage.
  Tensor Select(int64_t dim, int64_t index) const;  // drops `dim`
  Tensor Narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor Permute(const std::vector<int64_t>& order) const;
  Tensor Reshape(Shape shape) const;  // contiguous tensors only

  // A contiguous owning copy with the same dtype and values.
  Tensor Clone() const;
  // Copy values from a tensor of identical dtype and shape (any strides).
  void CopyFrom(const Tensor& src) const;
  // Every byte of every element equal (shapes and dtypes must match too).
  bool BitwiseEqual(const Tensor& other) const;

  // "bf16[2, 3, 4]".
  std::string Describe() const;

 private:
  void CheckElementType(size_t size) const;
  void CheckContiguous() const;

  std::shared_ptr<std::byte[]> storage_;
  std::byte* base_ = nullptr;
  DType dtype_ = DType::kF64;
  Shape shape_;
  Shape strides_;
};

// Calls fn(index) for every index of `shape` in row-major order.
template <class Fn>
void ForEachIndex(const Shape& shape, Fn&& fn) {
  const int64_t n = Tensor::NumElements(shape);
  std::vector<int64_t> index(shape.size(), 0);
  for (int64_t k = 0; k < n; ++k) {
    fn(std::span<const int64_t>(index));
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
      if (++index[static_cast<size_t>(d)] < shape[static_cast<size_t>(d)]) break;
      index[static_cast<size_t>(d)] = 0;
    }
  }
}

}  // namespace attest
