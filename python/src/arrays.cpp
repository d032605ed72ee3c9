#include "arrays.hpp"

#include <vector>

#include "grouplin/dtype.hpp"
#include "grouplin/error.hpp"

namespace grouplin::python {
namespace {

using nb::dlpack::dtype_code;

// GroupLin's dtype of a DLPack dtype; nullopt when GroupLin has none.
std::optional<DType> dtype_of(nb::dlpack::dtype d) {
  if (d.lanes != 1) return std::nullopt;
  switch (static_cast<dtype_code>(d.code)) {
    case dtype_code::Float:
      if (d.bits == 16) return DType::F16;
      if (d.bits == 32) return DType::F32;
      if (d.bits == 64) return DType::F64;
      return std::nullopt;
    case dtype_code::Bfloat:
      return d.bits == 16 ? std::optional(DType::BF16) : std::nullopt;
    case dtype_code::Bool:
      return d.bits == 8 ? std::optional(DType::BOOL) : std::nullopt;
    case dtype_code::Int:
      if (d.bits == 8) return DType::I8;
      if (d.bits == 16) return DType::I16;
      if (d.bits == 32) return DType::I32;
      if (d.bits == 64) return DType::I64;
      return std::nullopt;
    case dtype_code::UInt:
      if (d.bits == 8) return DType::U8;
      if (d.bits == 16) return DType::U16;
      if (d.bits == 32) return DType::U32;
      if (d.bits == 64) return DType::U64;
      return std::nullopt;
    case dtype_code::Float8_E4M3FN:
      return DType::F8_E4M3;
    case dtype_code::Float8_E5M2:
      return DType::F8_E5M2;
    case dtype_code::Float8_E8M0FNU:
      return DType::F8_E8M0;
    default:
      return std::nullopt;
  }
}

nb::dlpack::dtype dlpack(dtype_code code, int bits) {
  nb::dlpack::dtype d;
  d.code = static_cast<uint8_t>(code);
  d.bits = static_cast<uint8_t>(bits);
  d.lanes = 1;
  return d;
}

// The DLPack dtype a tensor of `t` is handed out as (see array_from_tensor).
nb::dlpack::dtype exported_dtype(DType t, Framework f) {
  const bool torch = f == Framework::Torch;
  switch (t) {
    case DType::F32:
      return dlpack(dtype_code::Float, 32);
    case DType::F16:
      return dlpack(dtype_code::Float, 16);
    case DType::F64:
      return dlpack(dtype_code::Float, 64);
    case DType::BF16:
      return torch ? dlpack(dtype_code::Bfloat, 16) : dlpack(dtype_code::UInt, 16);
    case DType::F8_E4M3:
    case DType::F8_E5M2:
    case DType::F8_E8M0:
    case DType::U8:
      return dlpack(dtype_code::UInt, 8);
    case DType::BOOL:
      return dlpack(dtype_code::Bool, 8);
    case DType::I8:
      return dlpack(dtype_code::Int, 8);
    case DType::I16:
      return dlpack(dtype_code::Int, 16);
    case DType::I32:
      return dlpack(dtype_code::Int, 32);
    case DType::I64:
      return dlpack(dtype_code::Int, 64);
    case DType::U16:
      return dlpack(torch ? dtype_code::Int : dtype_code::UInt, 16);
    case DType::U32:
      return dlpack(torch ? dtype_code::Int : dtype_code::UInt, 32);
    case DType::U64:
      return dlpack(torch ? dtype_code::Int : dtype_code::UInt, 64);
  }
  throw Error(ErrorCode::UnsupportedDType, "no array dtype for " + std::string(dtype_name(t)));
}

std::string describe(nb::dlpack::dtype d) {
  static const char* const kCodes[] = {"int",    "uint",    "float", "opaque",
                                       "bfloat", "complex", "bool"};
  const std::string code = d.code < 7 ? kCodes[d.code] : "code " + std::to_string(d.code);
  return code + std::to_string(d.bits) + (d.lanes != 1 ? "x" + std::to_string(d.lanes) : "");
}

}  // namespace

Framework framework_from_name(const std::string& name) {
  if (name == "numpy") return Framework::NumPy;
  if (name == "torch") return Framework::Torch;
  throw Error(ErrorCode::InvalidArgument,
              "framework " + quote(name) + ": expected \"numpy\" or \"torch\"");
}

Tensor tensor_from_array(const InArray& array, const std::optional<std::string>& dtype,
                         const std::string& what) {
  const std::optional<DType> own = dtype_of(array.dtype());
  DType t;
  if (dtype) {
    const std::optional<DType> named = dtype_from_name(*dtype);
    if (!named) {
      throw Error(ErrorCode::UnsupportedDType,
                  what + ": dtype " + quote(*dtype) + " is none of GroupLin's (F32, BF16, ...)");
    }
    // Raw codes: an integer array of the named type's width, or already that type.
    const auto code = static_cast<dtype_code>(array.dtype().code);
    const bool raw = (code == dtype_code::UInt || code == dtype_code::Int) &&
                     array.dtype().lanes == 1 && array.dtype().bits == 8 * dtype_size(*named);
    if (!raw && own != named) {
      throw Error(ErrorCode::DTypeMismatch,
                  what + ": " + std::string(dtype_name(*named)) + " must come as " +
                      std::to_string(8 * dtype_size(*named)) +
                      "-bit integer codes or as its own dtype, found " + describe(array.dtype()));
    }
    t = *named;
  } else {
    if (!own) {
      throw Error(ErrorCode::UnsupportedDType,
                  what + ": arrays of " + describe(array.dtype()) + " have no GroupLin dtype");
    }
    t = *own;
  }
  Shape shape(array.ndim());
  for (size_t d = 0; d < array.ndim(); ++d) shape[d] = static_cast<int64_t>(array.shape(d));
  // The tensor holds a reference to the array; dropping it may happen on a thread without the
  // interpreter lock (a layer replacing what it saved), so the deleter takes the lock.
  std::shared_ptr<const void> owner(new InArray(array), [](const void* p) {
    nb::gil_scoped_acquire gil;
    delete static_cast<const InArray*>(p);
  });
  return Tensor::from_blob(static_cast<const void*>(array.data()), shape, t, std::move(owner));
}

nb::object array_from_tensor(const Tensor& tensor, Framework framework) {
  if (!tensor.defined()) return nb::none();
  const Tensor t = framework == Framework::Torch && !tensor.writable() ? tensor.clone() : tensor;
  auto* keep = new Tensor(t);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  const nb::dlpack::dtype d = exported_dtype(t.dtype(), framework);
  auto* data = const_cast<std::byte*>(t.data());
  if (framework == Framework::Torch) {
    return nb::ndarray<nb::pytorch, nb::device::cpu>(data, shape.size(), shape.data(), owner,
                                                     nullptr, d)
        .cast();
  }
  if (t.writable()) {
    return nb::ndarray<nb::numpy>(data, shape.size(), shape.data(), owner, nullptr, d).cast();
  }
  return nb::ndarray<nb::numpy, nb::ro>(data, shape.size(), shape.data(), owner, nullptr, d).cast();
}

}  // namespace grouplin::python
