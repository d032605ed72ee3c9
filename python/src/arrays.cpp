#include "arrays.hpp"

#include <vector>

#include "grouplin/dtype.hpp"
#include "grouplin/error.hpp"

namespace grouplin::python {
namespace {

using nb::dlpack::dtype_code;

// Each GroupLin dtype's own DLPack type: what arrays of it are read as (dtype_of), and what they
// are handed out as, but where a framework lacks the type (exported_dtype).
struct DlpackType {
  DType dtype;
  dtype_code code;
  uint8_t bits;
};
constexpr DlpackType kDlpackTypes[] = {
    {DType::F32, dtype_code::Float, 32},
    {DType::F16, dtype_code::Float, 16},
    {DType::F64, dtype_code::Float, 64},
    {DType::BF16, dtype_code::Bfloat, 16},
    {DType::F8_E4M3, dtype_code::Float8_E4M3FN, 8},
    {DType::F8_E5M2, dtype_code::Float8_E5M2, 8},
    {DType::F8_E8M0, dtype_code::Float8_E8M0FNU, 8},
    {DType::BOOL, dtype_code::Bool, 8},
    {DType::I8, dtype_code::Int, 8},
    {DType::I16, dtype_code::Int, 16},
    {DType::I32, dtype_code::Int, 32},
    {DType::I64, dtype_code::Int, 64},
    {DType::U8, dtype_code::UInt, 8},
    {DType::U16, dtype_code::UInt, 16},
    {DType::U32, dtype_code::UInt, 32},
    {DType::U64, dtype_code::UInt, 64},
};

// GroupLin's dtype of a DLPack dtype; nullopt when GroupLin has none.
std::optional<DType> dtype_of(nb::dlpack::dtype d) {
  if (d.lanes != 1) return std::nullopt;
  for (const DlpackType& t : kDlpackTypes) {
    if (static_cast<uint8_t>(t.code) == d.code && t.bits == d.bits) return t.dtype;
  }
  return std::nullopt;
}

// The DLPack dtype a tensor of `t` is handed out as (see array_from_tensor): its own, but FP8 as
// uint8 codes (NumPy has no FP8; torch 1.13 neither), BF16 as uint16 codes for NumPy, and U16..U64
// as the signed type of their width for torch (1.13 has none of them).
nb::dlpack::dtype exported_dtype(DType t, Framework f) {
  for (const DlpackType& e : kDlpackTypes) {
    if (e.dtype != t) continue;
    nb::dlpack::dtype d;
    d.code = static_cast<uint8_t>(e.code);
    d.bits = e.bits;
    d.lanes = 1;
    const bool fp8 = t == DType::F8_E4M3 || t == DType::F8_E5M2 || t == DType::F8_E8M0;
    if (fp8 || (t == DType::BF16 && f == Framework::NumPy))
      d.code = static_cast<uint8_t>(dtype_code::UInt);
    if (e.code == dtype_code::UInt && e.bits > 8 && f == Framework::Torch) {
      d.code = static_cast<uint8_t>(dtype_code::Int);
    }
    return d;
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
