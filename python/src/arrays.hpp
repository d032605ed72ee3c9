// NumPy arrays and PyTorch tensors (anything with DLPack or the buffer protocol) as GroupLin
// tensors, and GroupLin tensors as arrays: both ways without copying bytes.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <memory>
#include <optional>
#include <string>

#include "grouplin/tensor.hpp"

namespace grouplin::python {

namespace nb = nanobind;

// Any C-contiguous CPU array, writable or not (GroupLin only reads the arrays it is given).
// A non-contiguous array is copied to a contiguous one by nanobind on the way in (the Python layer
// makes its arguments contiguous first anyway): never read with the wrong strides.
using InArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;

// Which array type a result is: numpy.ndarray or torch.Tensor.
enum class Framework { NumPy, Torch };

// "numpy" or "torch"; anything else is Error(InvalidArgument).
Framework framework_from_name(const std::string& name);

// A read-only tensor over `array`'s bytes (no copy) that keeps the array alive. `dtype` names
// the GroupLin dtype when the array holds raw codes of the same width ("BF16" over uint16 or
// int16, "F8_E4M3" over uint8); unset: the array's own dtype. `what` names the argument in
// errors: Error(UnsupportedDType) for a dtype GroupLin has not, Error(DTypeMismatch) for raw
// codes of another width.
Tensor tensor_from_array(const InArray& array, const std::optional<std::string>& dtype,
                         const std::string& what);

// `t` as an array viewing its bytes (no copy), keeping its storage alive; None for an
// undefined tensor. NumPy arrays of read-only tensors (file mappings) are read-only. Dtypes
// NumPy lacks come as raw codes (BF16 as uint16, FP8 as uint8), which the Python layer views
// as ml_dtypes types. PyTorch gets BF16 as bfloat16, FP8 as uint8 and U16/U32/U64 as the signed
// type of their width; a read-only tensor is copied first (torch has no read-only tensors,
// and a write into a read-only mapping would crash the process).
nb::object array_from_tensor(const Tensor& t, Framework framework);

}  // namespace grouplin::python
