#include "grouplin/tensor.hpp"

#include <cstdint>
#include <cstring>
#include <limits>

#include "core/storage_stats.hpp"
#include "grouplin/error.hpp"

namespace grouplin {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      throw Error(ErrorCode::InvalidArgument,
                  "shape " + shape_to_string(shape) + " has a negative dimension");
    }
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) {
      throw Error(ErrorCode::SizeOverflow,
                  "shape " + shape_to_string(shape) + " has more than 2^63 elements");
    }
    n *= d;
  }
  return n;
}

std::string shape_to_string(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

namespace {

// Byte size of numel elements of dtype, with overflow checked.
size_t checked_nbytes(int64_t numel, DType dtype, const Shape& shape) {
  size_t esize = dtype_size(dtype);
  auto n = static_cast<uint64_t>(numel);
  if (n > std::numeric_limits<size_t>::max() / esize) {
    throw Error(ErrorCode::SizeOverflow, "tensor " + std::string(dtype_name(dtype)) + " " +
                                             shape_to_string(shape) + " does not fit in memory");
  }
  return n * esize;
}

}  // namespace

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  size_t nbytes = checked_nbytes(shape_numel(shape), dtype, shape);
  return view_of(Storage::allocate(nbytes), 0, shape, dtype);
}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  size_t nbytes = checked_nbytes(shape_numel(shape), dtype, shape);
  return view_of(Storage::allocate_uninitialized(nbytes), 0, shape, dtype);
}

Tensor Tensor::from_f32(const Shape& shape, std::span<const float> values, DType dtype) {
  Tensor t = zeros(shape, dtype);
  if (static_cast<int64_t>(values.size()) != t.numel()) {
    throw Error(ErrorCode::ShapeMismatch, "Tensor::from_f32: shape " + shape_to_string(shape) +
                                              " needs " + std::to_string(t.numel()) +
                                              " values, got " + std::to_string(values.size()));
  }
  convert_elements(values.data(), DType::F32, t.mutable_data(), dtype, values.size());
  return t;
}

Tensor Tensor::view_of(std::shared_ptr<Storage> storage, size_t offset, const Shape& shape,
                       DType dtype) {
  if (!storage) throw Error(ErrorCode::UndefinedTensor, "Tensor::view_of: null storage");
  int64_t numel = shape_numel(shape);
  size_t nbytes = checked_nbytes(numel, dtype, shape);
  size_t len = storage->size();
  if (offset > len || nbytes > len - offset) {
    throw Error(ErrorCode::OutOfBounds,
                "view " + std::string(dtype_name(dtype)) + " " + shape_to_string(shape) +
                    " at byte " + std::to_string(offset) + " needs " + std::to_string(nbytes) +
                    " bytes but the storage has " + std::to_string(len));
  }
  Tensor t;
  t.storage_ = std::move(storage);
  t.offset_ = offset;
  t.shape_ = shape;
  t.numel_ = numel;
  t.dtype_ = dtype;
  return t;
}

namespace {

// The bytes of `shape` x `dtype` at `data`, checked for from_blob.
size_t blob_bytes(const void* data, const Shape& shape, DType dtype) {
  const size_t nbytes = checked_nbytes(shape_numel(shape), dtype, shape);
  const std::string what =
      "Tensor::from_blob(" + std::string(dtype_name(dtype)) + " " + shape_to_string(shape) + ")";
  if (data == nullptr && nbytes != 0) {
    throw Error(ErrorCode::InvalidArgument,
                what + ": null data for " + std::to_string(nbytes) + " bytes");
  }
  if (reinterpret_cast<uintptr_t>(data) % dtype_size(dtype) != 0) {
    throw Error(ErrorCode::InvalidArgument, what + ": data at an address not aligned to " +
                                                std::to_string(dtype_size(dtype)) +
                                                " bytes (the element size)");
  }
  return nbytes;
}

}  // namespace

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype,
                         std::shared_ptr<const void> owner) {
  const size_t nbytes = blob_bytes(data, shape, dtype);
  return view_of(Storage::wrap_writable(static_cast<std::byte*>(data), nbytes, std::move(owner)), 0,
                 shape, dtype);
}

Tensor Tensor::from_blob(const void* data, const Shape& shape, DType dtype,
                         std::shared_ptr<const void> owner) {
  const size_t nbytes = blob_bytes(data, shape, dtype);
  return view_of(Storage::wrap(static_cast<const std::byte*>(data), nbytes, std::move(owner)), 0,
                 shape, dtype);
}

std::byte* Tensor::mutable_data() {
  if (!storage_) return nullptr;
  if (read_only_) {
    throw Error(ErrorCode::ReadOnlyTensor,
                "writing through a read-only view of " + std::string(dtype_name(dtype_)) + " " +
                    shape_to_string(shape_) +
                    ": its bytes are borrowed (a state dict loaded with assign=true, or a file); "
                    "clone() it, or write through writable_value() of the parameter");
  }
  return storage_->mutable_data() + offset_;
}

Tensor Tensor::read_only() const {
  Tensor t = *this;
  t.read_only_ = true;
  // A read-only alias of the storage, keeping it alive: what storage() hands out then refuses
  // writes too (Storage::mutable_data, Tensor::view_of over it), not only this view.
  if (storage_ && storage_->writable()) {
    t.storage_ = Storage::read_only_alias(storage_);
  }
  return t;
}

Tensor Tensor::select(int64_t i) const {
  if (rank() == 0 || i < 0 || i >= shape_[0]) {
    throw Error(ErrorCode::OutOfBounds, "select(" + std::to_string(i) + ") on a tensor of shape " +
                                            shape_to_string(shape_));
  }
  Shape inner(shape_.begin() + 1, shape_.end());
  size_t stride = static_cast<size_t>(shape_numel(inner)) * dtype_size(dtype_);
  return derived(view_of(storage_, offset_ + static_cast<size_t>(i) * stride, inner, dtype_));
}

Tensor Tensor::rows(int64_t begin, int64_t count) const {
  if (rank() == 0 || begin < 0 || count < 0 || begin > shape_[0] || count > shape_[0] - begin) {
    throw Error(ErrorCode::OutOfBounds, "rows(" + std::to_string(begin) + ", " +
                                            std::to_string(count) + ") on a tensor of shape " +
                                            shape_to_string(shape_));
  }
  Shape s = shape_;
  s[0] = count;
  size_t row_bytes = shape_[0] == 0 ? 0 : nbytes() / static_cast<size_t>(shape_[0]);
  return derived(view_of(storage_, offset_ + static_cast<size_t>(begin) * row_bytes, s, dtype_));
}

Tensor Tensor::reshape(const Shape& shape) const {
  if (shape_numel(shape) != numel_) {
    throw Error(ErrorCode::ShapeMismatch, "reshape from " + shape_to_string(shape_) + " to " +
                                              shape_to_string(shape) + ": element counts differ");
  }
  return derived(view_of(storage_, offset_, shape, dtype_));
}

Tensor Tensor::clone() const { return to(dtype_); }

Tensor Tensor::to(DType dtype) const {
  if (!defined()) throw Error(ErrorCode::UndefinedTensor, "converting an undefined tensor");
  Tensor t = zeros(shape_, dtype);
  t.copy_from(*this);
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  if (!defined() || !src.defined()) {
    throw Error(ErrorCode::UndefinedTensor, "copy_from with an undefined tensor");
  }
  if (src.numel_ != numel_) {
    throw Error(ErrorCode::ShapeMismatch,
                "copying " + shape_to_string(src.shape_) + " into " + shape_to_string(shape_));
  }
  std::byte* dst = mutable_data();
  if (src.dtype_ == dtype_) {
    if (nbytes() != 0 && dst != src.data()) std::memmove(dst, src.data(), nbytes());
  } else {
    convert_elements(src.data(), src.dtype_, dst, dtype_, static_cast<size_t>(numel_));
  }
  detail::count_copied_bytes(nbytes());
}

void Tensor::zero() {
  if (nbytes() != 0) std::memset(mutable_data(), 0, nbytes());
}

bool Tensor::same_view(const Tensor& other) const {
  // The bytes, not the Storage object: a read_only() view aliases its source's storage.
  return defined() == other.defined() && data() == other.data() && nbytes() == other.nbytes();
}

bool Tensor::bit_equal(const Tensor& other) const {
  if (dtype_ != other.dtype_ || shape_ != other.shape_) return false;
  if (nbytes() == 0) return true;
  return std::memcmp(data(), other.data(), nbytes()) == 0;
}

}  // namespace grouplin
