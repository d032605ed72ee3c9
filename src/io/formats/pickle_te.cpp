// TransformerEngine's FP8 tensors in the pickle machine (see io/pickle_torch.hpp and
// docs/pt-format.md): Float8Tensor and MXFP8Tensor as their reconstructors' arguments describe
// them, every argument's type and size checked, built here and never called. Their codes become
// tensors of the state dict, their scales `<key>_scale_inv` beside them (TorchBuilder::finish).
#include <cstdint>
#include <string>

#include "grouplin/error.hpp"
#include "io/formats/pickle_globals.hpp"
#include "io/formats/pickle_torch.hpp"

namespace grouplin::pickle {

const TensorRef* TorchBuilder::codes_or_none(Ref r, std::string_view fn, const char* what) const {
  const Value& v = values_.get(r);
  if (v.kind == Kind::None) return nullptr;
  if (v.kind != Kind::Tensor) {
    cursor_.invalid(std::string(fn) + ": " + what + " is a " + kind_name(v.kind) +
                    ", expected a tensor or None");
  }
  const TensorRef& t = tensors_[static_cast<size_t>(v.number)];
  if (dtype_size(t.dtype) != 1) {
    cursor_.invalid(std::string(fn) + ": " + what + " is " + std::string(dtype_name(t.dtype)) +
                    ", expected uint8 codes");
  }
  return &t;
}

Ref TorchBuilder::push_fp8(TensorRef codes, int64_t te_code, TeCodes numbering, size_t scale,
                           bool dropped_columnwise) {
  // The dtype is decided at finish, where every FP8 tensor of the file is known (the legacy
  // 5-argument form needs them all) and the entry's key can be named.
  codes.dtype = DType::U8;
  const Ref ref = push_tensor(std::move(codes));
  values_.grow(float8_, "tensors");
  float8_.push_back({tensors_.size() - 1, scale, te_code, numbering, dropped_columnwise});
  values_.charge(kHashEntryBytes, "tensors");
  float8_of_tensor_.emplace(tensors_.size() - 1, float8_.size() - 1);
  return ref;
}

Ref TorchBuilder::float8_tensor(std::span<const Ref> a, bool legacy) {
  // What each TransformerEngine release wrote (docs/pt-format.md): the legacy route
  // (Float8Tensor._make_in_reduce_ex) with 4 arguments (TE 1.2-1.13: data, fp8_dtype,
  // fp8_scale_inv, dtype) or 5 (TE 2.0-2.15: + shape); the module-level reconstructor with 5
  // (TE 2.16 on) or 6 (+ data_transpose: TE's main after 2.18). No release wrote another arity.
  const std::string_view fn =
      legacy ? "Float8Tensor._make_in_reduce_ex" : "_make_float8_tensor_in_reduce_ex";
  const bool fits = legacy ? a.size() == 4 || a.size() == 5 : a.size() == 5 || a.size() == 6;
  if (!fits) {
    cursor_.invalid(std::string(fn) + " called with " + std::to_string(a.size()) +
                    " arguments, which no TransformerEngine release wrote; expected " +
                    (legacy ? "4 (data, fp8_dtype, fp8_scale_inv, dtype: TE 1.x) or 5 (+ shape: "
                              "TE 2.0-2.15)"
                            : "5 (data, fp8_dtype, fp8_scale_inv, dtype, shape: TE 2.16 on) or 6 "
                              "(+ data_transpose)"));
  }
  const TensorRef* data = codes_or_none(a[0], fn, "data");
  const TensorRef* transpose = a.size() == 6 ? codes_or_none(a[5], fn, "data_transpose") : nullptr;
  if (values_.get(a[1]).kind != Kind::TeDType || values_.get(a[1]).number < 0) {
    cursor_.invalid(std::string(fn) + ": fp8_dtype is a " + kind_name(values_.get(a[1]).kind) +
                    (values_.get(a[1]).kind == Kind::TeDType ? " without its code" : "") +
                    ", expected a TransformerEngine DType");
  }
  const int64_t code = values_.get(a[1]).number;
  if (values_.get(a[1]).aux == 1 && legacy) {
    cursor_.invalid(std::string(fn) +
                    ": fp8_dtype is a DType by member name, which only TE 2.17 "
                    "on writes, with the module-level reconstructor");
  }
  const Value& scale = values_.get(a[2]);
  if (scale.kind != Kind::Tensor) {
    cursor_.invalid(std::string(fn) + ": fp8_scale_inv is a " + kind_name(scale.kind) +
                    ", expected a tensor");
  }
  const auto scale_index = static_cast<size_t>(scale.number);
  const TensorRef& s = tensors_[scale_index];
  int64_t scale_numel = 1;
  for (int64_t d : s.shape) scale_numel *= d;
  if (s.dtype != DType::F32 || scale_numel != 1) {
    cursor_.invalid(std::string(fn) + ": fp8_scale_inv is " + std::string(dtype_name(s.dtype)) +
                    " " + shape_to_string(s.shape) + ", expected one F32 value");
  }
  if (!is_global(values_, a[3], GlobalKind::DTypeTag)) {
    cursor_.invalid(std::string(fn) + ": dtype is a " + kind_name(values_.get(a[3]).kind) +
                    ", expected a torch dtype");
  }
  if (a.size() == 4 && data == nullptr) cursor_.invalid(std::string(fn) + ": data is None");
  const Shape shape =
      a.size() == 4 ? data->shape : expect_int_tuple(a[4], std::string(fn) + ": shape");
  TensorRef t;
  if (data != nullptr) {
    if (data->shape != shape) {
      cursor_.invalid(std::string(fn) + ": data has shape " + shape_to_string(data->shape) +
                      ", the tensor " + shape_to_string(shape));
    }
    t = *data;
  } else if (transpose != nullptr) {
    // Only the transpose kept: the logical [out, in] weight is a strided view of it.
    const bool fits = shape.size() == 2 && transpose->shape == Shape{shape[1], shape[0]};
    if (!fits) {
      cursor_.invalid(std::string(fn) + ": data_transpose has shape " +
                      shape_to_string(transpose->shape) + ", expected the transpose of " +
                      shape_to_string(shape));
    }
    t = *transpose;
    t.shape = shape;
    t.stride = {transpose->stride[1], transpose->stride[0]};
  } else {
    cursor_.invalid(std::string(fn) + ": neither data nor data_transpose is given");
  }
  const TeCodes numbering = !legacy         ? TeCodes::From2_4
                            : a.size() == 4 ? TeCodes::UpTo2_3
                                            : TeCodes::Either;
  return push_fp8(std::move(t), code, numbering, scale_index, false);
}

Ref TorchBuilder::mxfp8_tensor(std::span<const Ref> a, bool legacy) {
  const std::string_view fn =
      legacy ? "MXFP8Tensor._make_in_reduce_ex" : "_make_mxfp8_tensor_in_reduce_ex";
  // What each release wrote: legacy 6 (TE 2.0-2.2), 7 + shape (2.3-2.5), 8 + quantizer
  // (2.6-2.11), 9 + with_gemm_swizzled_scales (2.12-2.15); module-level 9 (2.16 on; 8 accepted).
  if (a.size() < (legacy ? 6u : 8u) || a.size() > 9) {
    cursor_.invalid(std::string(fn) + " called with " + std::to_string(a.size()) +
                    " arguments, expected " + (legacy ? "6 to 9" : "9") +
                    " (rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv, "
                    "fp8_dtype, dtype, shape, quantizer, with_gemm_swizzled_scales)");
  }
  const TensorRef* data = codes_or_none(a[0], fn, "rowwise_data");
  const TensorRef* scales = codes_or_none(a[1], fn, "rowwise_scale_inv");
  // A second quantization for the transposed GEMM: dropped, and said (PtReadOptions::notes).
  const bool columnwise = codes_or_none(a[2], fn, "columnwise_data") != nullptr;
  codes_or_none(a[3], fn, "columnwise_scale_inv");
  if (values_.get(a[4]).kind != Kind::TeDType) {
    cursor_.invalid(std::string(fn) + ": fp8_dtype is a " + kind_name(values_.get(a[4]).kind) +
                    ", expected a TransformerEngine DType");
  }
  if (!is_global(values_, a[5], GlobalKind::DTypeTag)) {
    cursor_.invalid(std::string(fn) + ": dtype is a " + kind_name(values_.get(a[5]).kind) +
                    ", expected a torch dtype");
  }
  if (a.size() == 6 && data == nullptr) {
    cursor_.fail(ErrorCode::UnsupportedConversion,
                 std::string(fn) +
                     ": an MXFP8Tensor without its row-wise data and scales (only the column-wise "
                     "copy kept), which GroupLin does not read");
  }
  const Shape shape =
      a.size() > 6 ? expect_int_tuple(a[6], std::string(fn) + ": shape") : data->shape;
  const Kind quantizer = a.size() > 7 ? values_.get(a[7]).kind : Kind::None;
  if (quantizer != Kind::None && quantizer != Kind::TeQuantizer) {
    cursor_.invalid(std::string(fn) + ": quantizer is a " + kind_name(quantizer) +
                    ", expected an MXFP8Quantizer or None");
  }
  bool swizzled = false;
  if (a.size() == 9) {
    if (values_.get(a[8]).kind != Kind::Bool) {
      cursor_.invalid(std::string(fn) + ": with_gemm_swizzled_scales is not a bool");
    }
    swizzled = values_.get(a[8]).number != 0;
  }
  if (data == nullptr || scales == nullptr) {
    cursor_.fail(ErrorCode::UnsupportedConversion,
                 std::string(fn) +
                     ": an MXFP8Tensor without its row-wise data and scales (only the column-wise "
                     "copy kept), which GroupLin does not read");
  }
  if (shape.size() != 2 || data->shape != shape || !is_contiguous(data->shape, data->stride)) {
    cursor_.invalid(std::string(fn) + ": rowwise_data has shape " + shape_to_string(data->shape) +
                    ", expected the contiguous 2-D " + shape_to_string(shape));
  }
  // TE pads the scales to [roundup(M, 128), roundup(ceil(K / 32), 4)]; exactly that is accepted.
  auto round_up = [](int64_t n, int64_t m) { return (n + m - 1) / m * m; };
  const int64_t rows = shape[0], cols = (shape[1] + 31) / 32;
  const Shape padded{round_up(rows, 128), round_up(cols, 4)};
  if (scales->shape != padded || !is_contiguous(scales->shape, scales->stride)) {
    cursor_.invalid(std::string(fn) + ": rowwise_scale_inv has shape " +
                    shape_to_string(scales->shape) + ", expected the contiguous " +
                    shape_to_string(padded) + " TransformerEngine pads " + shape_to_string(shape) +
                    "'s [1, 32] block scales to");
  }
  TensorRef s = *scales;
  s.dtype = DType::F8_E8M0;
  s.shape = {rows, cols};
  s.stride = {padded[1], 1};  // the unpadded corner; pt_reader unswizzles a swizzled one
  s.mx_swizzled = swizzled;
  s.mx_padded_cols = padded[1];
  TensorRef codes = *data;  // copied first: pushing the scales may move tensors_
  const auto scale_index = static_cast<size_t>(values_.get(push_tensor(std::move(s))).number);
  // TE renumbered its dtypes at 2.4: the 6-argument form is older, the 7-argument one either.
  const TeCodes numbering = !legacy || a.size() >= 8 ? TeCodes::From2_4
                            : a.size() == 6          ? TeCodes::UpTo2_3
                                                     : TeCodes::Either;
  return push_fp8(std::move(codes), values_.get(a[4]).number, numbering, scale_index, columnwise);
}

}  // namespace grouplin::pickle
