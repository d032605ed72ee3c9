// Element type sizes and names. The names are the safetensors spellings, so that a header's
// "dtype" field parses with dtype_from_name and writes back with dtype_name unchanged.

#include "grouplin/dtype.hpp"

#include <string>

#include "grouplin/error.hpp"

namespace grouplin {

namespace {

// Only reachable with a value cast into DType from outside the enum.
[[noreturn]] void throw_not_a_dtype(const char* what, DType t) {
  throw Error(ErrorCode::UnsupportedDType,
              std::string(what) + ": value " + std::to_string(static_cast<int>(t)) +
                  " is not a DType; expected one of the kAllDTypes entries");
}

}  // namespace

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64:
    case DType::I64:
    case DType::U64:
      return 8;
    case DType::F32:
    case DType::I32:
    case DType::U32:
      return 4;
    case DType::F16:
    case DType::BF16:
    case DType::I16:
    case DType::U16:
      return 2;
    case DType::F8_E4M3:
    case DType::F8_E5M2:
    case DType::F8_E8M0:
    case DType::BOOL:
    case DType::U8:
    case DType::I8:
      return 1;
  }
  throw_not_a_dtype("getting the element size", t);
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::F16:
      return "F16";
    case DType::BF16:
      return "BF16";
    case DType::F8_E4M3:
      return "F8_E4M3";
    case DType::F8_E5M2:
      return "F8_E5M2";
    case DType::F8_E8M0:
      return "F8_E8M0";
    case DType::F64:
      return "F64";
    case DType::BOOL:
      return "BOOL";
    case DType::U8:
      return "U8";
    case DType::I8:
      return "I8";
    case DType::I16:
      return "I16";
    case DType::U16:
      return "U16";
    case DType::I32:
      return "I32";
    case DType::U32:
      return "U32";
    case DType::I64:
      return "I64";
    case DType::U64:
      return "U64";
  }
  throw_not_a_dtype("getting the dtype name", t);
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType t : kAllDTypes) {
    if (dtype_name(t) == name) return t;
  }
  return std::nullopt;
}

bool is_float(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::F8_E4M3:
    case DType::F8_E5M2:
    case DType::F8_E8M0:
    case DType::F64:
      return true;
    default:
      return false;
  }
}

}  // namespace grouplin
