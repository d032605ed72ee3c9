#include "grouplin/grouped_tensor.hpp"

#include <limits>

#include "grouplin/error.hpp"

namespace grouplin {
namespace {

size_t align_up(size_t n) {
  size_t rounded = (n + kStorageAlignment - 1) / kStorageAlignment * kStorageAlignment;
  if (rounded < n) throw Error(ErrorCode::SizeOverflow, "grouped tensor does not fit in memory");
  return rounded;
}

}  // namespace

GroupedTensor GroupedTensor::make(std::span<const Shape> shapes, DType dtype) {
  if (shapes.empty()) throw Error(ErrorCode::InvalidArgument, "GroupedTensor::make: no members");
  GroupedTensor g;
  g.dtype_ = dtype;
  size_t end = 0;
  for (const Shape& s : shapes) {
    size_t start = align_up(end);
    auto numel = static_cast<uint64_t>(shape_numel(s));
    size_t esize = dtype_size(dtype);
    if (numel > (std::numeric_limits<size_t>::max() - start) / esize) {
      throw Error(ErrorCode::SizeOverflow, "grouped tensor does not fit in memory");
    }
    g.offsets_.push_back(start);
    g.shapes_.push_back(s);
    end = start + numel * esize;
  }
  g.storage_ = Storage::allocate(end);
  return g;
}

GroupedTensor GroupedTensor::make_uniform(int64_t n, const Shape& shape, DType dtype) {
  if (n < 1) {
    throw Error(ErrorCode::InvalidArgument, "GroupedTensor::make_uniform: member count " +
                                                std::to_string(n) + ", expected >= 1");
  }
  std::vector<Shape> shapes(static_cast<size_t>(n), shape);
  return make(shapes, dtype);
}

GroupedTensor GroupedTensor::from_members(std::span<const Tensor> members) {
  if (members.empty()) {
    throw Error(ErrorCode::InvalidArgument, "GroupedTensor::from_members: no members");
  }
  std::vector<Shape> shapes;
  for (size_t i = 0; i < members.size(); ++i) {
    if (!members[i].defined()) {
      throw Error(ErrorCode::UndefinedTensor,
                  "GroupedTensor::from_members: member " + std::to_string(i) + " is undefined");
    }
    if (members[i].dtype() != members[0].dtype()) {
      throw Error(ErrorCode::DTypeMismatch,
                  "GroupedTensor::from_members: member " + std::to_string(i) + " is " +
                      std::string(dtype_name(members[i].dtype())) + ", member 0 is " +
                      std::string(dtype_name(members[0].dtype())));
    }
    shapes.push_back(members[i].shape());
  }
  GroupedTensor g = make(shapes, members[0].dtype());
  for (size_t i = 0; i < members.size(); ++i)
    g.member(static_cast<int64_t>(i)).copy_from(members[i]);
  return g;
}

Tensor GroupedTensor::member(int64_t i) const {
  if (i < 0 || i >= num_members()) {
    throw Error(ErrorCode::OutOfBounds, "GroupedTensor::member(" + std::to_string(i) + ") of " +
                                            std::to_string(num_members()) + " members");
  }
  auto k = static_cast<size_t>(i);
  return Tensor::view_of(storage_, offsets_[k], shapes_[k], dtype_);
}

std::vector<Tensor> GroupedTensor::members() const {
  std::vector<Tensor> out;
  out.reserve(offsets_.size());
  for (int64_t i = 0; i < num_members(); ++i) out.push_back(member(i));
  return out;
}

bool GroupedTensor::is_stackable() const {
  if (offsets_.empty()) return false;
  size_t member_bytes = static_cast<size_t>(shape_numel(shapes_[0])) * dtype_size(dtype_);
  for (size_t i = 0; i < offsets_.size(); ++i) {
    if (shapes_[i] != shapes_[0] || offsets_[i] != i * member_bytes) return false;
  }
  return true;
}

Tensor GroupedTensor::stacked() const {
  if (!is_stackable()) {
    throw Error(ErrorCode::NotStackable,
                "GroupedTensor::stacked: members differ in shape or are padded to " +
                    std::to_string(kStorageAlignment) + "-byte boundaries");
  }
  Shape s = shapes_[0];
  s.insert(s.begin(), num_members());
  return Tensor::view_of(storage_, 0, s, dtype_);
}

}  // namespace grouplin
