// Tensor: a shape, an element type and a byte range of a shared Storage.
//
//   auto x = grouplin::Tensor::zeros({4, 8}, grouplin::DType::F32);
//   float* p = x.mutable_data_as<float>();
//   grouplin::Tensor row2 = x.select(2);          // view [8], shares storage
//   grouplin::Tensor bf = x.to(grouplin::DType::BF16);  // converted copy
//
// Tensors are always row-major contiguous. Copying a Tensor object copies the view, never the
// bytes. A default-constructed Tensor is undefined (defined() == false).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "grouplin/dtype.hpp"
#include "grouplin/storage.hpp"

namespace grouplin {

using Shape = std::vector<int64_t>;

// Number of elements of a shape; throws Error(InvalidArgument) on a negative dimension and
// Error(SizeOverflow) when the product does not fit in int64_t.
int64_t shape_numel(const Shape& shape);
// "[2, 3, 4]".
std::string shape_to_string(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;

  // New zero-filled heap tensor.
  static Tensor zeros(const Shape& shape, DType dtype);
  // New heap tensor whose bytes are unspecified: for an output its producer writes whole.
  static Tensor empty(const Shape& shape, DType dtype);
  // New heap tensor holding a copy of `values` converted from F32 to `dtype` (a float type).
  // Throws Error(ShapeMismatch) if values.size() != numel(shape).
  static Tensor from_f32(const Shape& shape, std::span<const float> values,
                         DType dtype = DType::F32);
  // View of `storage` starting at byte `offset`. Throws Error(OutOfBounds) if the bytes do not
  // fit in the storage.
  static Tensor view_of(std::shared_ptr<Storage> storage, size_t offset, const Shape& shape,
                        DType dtype);
  // A tensor over memory the caller owns (a NumPy or PyTorch buffer, an engine's arena), without
  // a copy: writable through `data`, read-only through `const void*` data. `owner` (may be null)
  // is kept alive with the tensor's storage; otherwise the caller keeps the memory valid while
  // any view of it lives. Throws Error(InvalidArgument) for a null `data` with elements, or data
  // not aligned to the element size (the kernels read whole elements); the shape errors of
  // shape_numel.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype,
                          std::shared_ptr<const void> owner = nullptr);
  static Tensor from_blob(const void* data, const Shape& shape, DType dtype,
                          std::shared_ptr<const void> owner = nullptr);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  size_t rank() const { return shape_.size(); }
  // Size of dimension d; Requires: d < rank().
  int64_t dim(size_t d) const { return shape_[d]; }
  int64_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }

  const std::shared_ptr<Storage>& storage() const { return storage_; }
  size_t storage_offset() const { return offset_; }
  const std::byte* data() const { return storage_ ? storage_->data() + offset_ : nullptr; }
  // Throws Error(ReadOnlyTensor) when the tensor is not writable() (see read_only()).
  std::byte* mutable_data();
  template <class T>
  const T* data_as() const {
    return reinterpret_cast<const T*>(data());
  }
  template <class T>
  T* mutable_data_as() {
    return reinterpret_cast<T*>(mutable_data());
  }
  // False for undefined tensors, for read-only storage (a file mapping) and for read_only()
  // views: then mutable_data(), copy_from() and zero() throw Error(ReadOnlyTensor).
  bool writable() const { return storage_ && storage_->writable() && !read_only_; }
  // This view, with every write through it (or through views made from it) refused: its storage()
  // is a read-only alias of this one's (Storage::wrap, keeping it alive), so no path from it
  // writes. How bytes that belong to someone else are handed out: a module that borrowed a
  // caller's tensor (load_state_dict with assign=true) shows only read-only views of it.
  Tensor read_only() const;

  // View of slice i along dimension 0 (rank drops by one). Throws Error(OutOfBounds).
  Tensor select(int64_t i) const;
  // View of rows [begin, begin + count) along dimension 0. Throws Error(OutOfBounds).
  Tensor rows(int64_t begin, int64_t count) const;
  // View with another shape of the same numel. Throws Error(ShapeMismatch).
  Tensor reshape(const Shape& shape) const;

  // New heap tensor with the same bytes.
  Tensor clone() const;
  // New heap tensor converted to `dtype` (float types only; same dtype clones).
  Tensor to(DType dtype) const;
  // Copies src's values into this tensor's bytes, converting float dtypes as needed.
  // Throws Error(ShapeMismatch) on different numel, Error(UnsupportedConversion) for a
  // non-float pair of different dtypes, Error(ReadOnlyTensor) if this tensor is read-only.
  void copy_from(const Tensor& src);
  // Sets every byte to zero.
  void zero();

  // True when both view the same bytes (same address, same size), through one storage or a
  // read-only alias of it (read_only()).
  bool same_view(const Tensor& other) const;
  // True when the values are bit-identical (same dtype, shape and bytes).
  bool bit_equal(const Tensor& other) const;

 private:
  // `view`, refusing writes when this tensor does.
  Tensor derived(Tensor view) const {
    view.read_only_ = read_only_;
    return view;
  }

  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::F32;
  bool read_only_ = false;
};

}  // namespace grouplin
