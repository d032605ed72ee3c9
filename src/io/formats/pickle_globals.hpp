// Private to the pickle machine's torch side (pickle_torch.cpp, pickle_te.cpp): the globals a
// state-dict pickle may name, each with what it stands for. Anything not listed is refused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "grouplin/dtype.hpp"
#include "io/formats/pickle_values.hpp"

namespace grouplin::pickle {

// What an allowed global stands for.
// clang-format off
enum class GlobalKind : uint8_t { OrderedDict, RebuildTensorV2, RebuildTensorV3, RebuildParameter, StorageType, DTypeTag,
                                  TeFloat8Tensor, TeFloat8TensorLegacy, TeFloat8TensorClass, Getattr,
                                  TeDType, TorchSize,
                                  TeMxfp8Tensor, TeMxfp8Quantizer, TeMxfp8TensorLegacy, TeMxfp8TensorClass,
                                  InertClass, CodecsEncode };
// clang-format on

struct AllowedGlobal {
  std::string_view name;
  GlobalKind kind;
  DType dtype = DType::U8;
  bool untyped = false;
};

inline constexpr AllowedGlobal kAllowedGlobals[] = {
    {"collections.OrderedDict", GlobalKind::OrderedDict},
    {"torch._utils._rebuild_tensor_v2", GlobalKind::RebuildTensorV2},
    {"torch._utils._rebuild_tensor_v3", GlobalKind::RebuildTensorV3},
    {"torch._utils._rebuild_parameter", GlobalKind::RebuildParameter},
    // TransformerEngine's FP8 weights (docs/pt-format.md): its reconstructor (TE 2.16 on), the
    // legacy route to it (getattr(Float8Tensor, '_make_in_reduce_ex'), the only getattr
    // accepted; the class in its module of TE 1.11 on and of TE 1.2-1.10), its dtype enum in
    // every spelling (pybind11's of TE 1.2-1.7 and 1.8-2.16, the IntEnum of TE 2.17 on), and
    // torch.Size for shapes. Each is built here, never called.
    {"transformer_engine.pytorch.tensor.float8_tensor._make_float8_tensor_in_reduce_ex",
     GlobalKind::TeFloat8Tensor},
    {"transformer_engine.pytorch.tensor.float8_tensor.Float8Tensor._make_in_reduce_ex",
     GlobalKind::TeFloat8TensorLegacy},
    {"transformer_engine.pytorch.tensor.float8_tensor.Float8Tensor",
     GlobalKind::TeFloat8TensorClass},
    {"transformer_engine.pytorch.float8_tensor.Float8Tensor", GlobalKind::TeFloat8TensorClass},
    {"__builtin__.getattr", GlobalKind::Getattr},
    {"builtins.getattr", GlobalKind::Getattr},
    {"transformer_engine.pytorch.constants.DType", GlobalKind::TeDType},
    {"transformer_engine_torch.DType", GlobalKind::TeDType},
    {"transformer_engine_extensions.DType", GlobalKind::TeDType},
    {"torch.Size", GlobalKind::TorchSize},
    {"transformer_engine.pytorch.tensor.mxfp8_tensor._make_mxfp8_tensor_in_reduce_ex",
     GlobalKind::TeMxfp8Tensor},
    {"transformer_engine.pytorch.tensor.mxfp8_tensor.MXFP8Quantizer", GlobalKind::TeMxfp8Quantizer},
    // MXFP8Tensor's legacy route, getattr(MXFP8Tensor, '_make_in_reduce_ex') (TE 2.0-2.15).
    {"transformer_engine.pytorch.tensor.mxfp8_tensor.MXFP8Tensor", GlobalKind::TeMxfp8TensorClass},
    {"transformer_engine.pytorch.tensor.mxfp8_tensor.MXFP8Tensor._make_in_reduce_ex",
     GlobalKind::TeMxfp8TensorLegacy},
    // Data that training checkpoints keep beside the tensors, read as inert objects (built by
    // no code, their state parsed and dropped) and skipped with a note: TransformerEngine
    // 0.12-1.13's _extra_state (an io.BytesIO holding a torch.save of its FP8 metadata, its
    // bytes spelled _codecs.encode(str, 'latin1') as protocol 2 writes bytes), Megatron's
    // argparse.Namespace args, numpy arrays and dtypes of RNG states (numpy 1 and 2 spellings).
    {"_io.BytesIO", GlobalKind::InertClass},
    {"argparse.Namespace", GlobalKind::InertClass},
    {"numpy.core.multiarray._reconstruct", GlobalKind::InertClass},
    {"numpy._core.multiarray._reconstruct", GlobalKind::InertClass},
    {"numpy.core.multiarray.scalar", GlobalKind::InertClass},
    {"numpy._core.multiarray.scalar", GlobalKind::InertClass},
    {"numpy.ndarray", GlobalKind::InertClass},
    {"numpy.dtype", GlobalKind::InertClass},
    {"_codecs.encode", GlobalKind::CodecsEncode},
    {"torch.FloatStorage", GlobalKind::StorageType, DType::F32},
    {"torch.DoubleStorage", GlobalKind::StorageType, DType::F64},
    {"torch.HalfStorage", GlobalKind::StorageType, DType::F16},
    {"torch.BFloat16Storage", GlobalKind::StorageType, DType::BF16},
    {"torch.LongStorage", GlobalKind::StorageType, DType::I64},
    {"torch.IntStorage", GlobalKind::StorageType, DType::I32},
    {"torch.ShortStorage", GlobalKind::StorageType, DType::I16},
    {"torch.CharStorage", GlobalKind::StorageType, DType::I8},
    {"torch.ByteStorage", GlobalKind::StorageType, DType::U8},
    {"torch.BoolStorage", GlobalKind::StorageType, DType::BOOL},
    // The storage of dtypes without a typed storage class (float8, uint16, ...), as PyTorch 2.x
    // pickles the class (its module is torch.storage); "torch.UntypedStorage" is how GroupLin's
    // writer spelled it before it wrote what torch.load(weights_only=True) accepts.
    {"torch.storage.UntypedStorage", GlobalKind::StorageType, DType::U8, true},
    {"torch.UntypedStorage", GlobalKind::StorageType, DType::U8, true},
    {"torch.float32", GlobalKind::DTypeTag, DType::F32},
    {"torch.float64", GlobalKind::DTypeTag, DType::F64},
    {"torch.float16", GlobalKind::DTypeTag, DType::F16},
    {"torch.bfloat16", GlobalKind::DTypeTag, DType::BF16},
    {"torch.float8_e4m3fn", GlobalKind::DTypeTag, DType::F8_E4M3},
    {"torch.float8_e5m2", GlobalKind::DTypeTag, DType::F8_E5M2},
    {"torch.float8_e8m0fnu", GlobalKind::DTypeTag, DType::F8_E8M0},
    {"torch.int64", GlobalKind::DTypeTag, DType::I64},
    {"torch.int32", GlobalKind::DTypeTag, DType::I32},
    {"torch.int16", GlobalKind::DTypeTag, DType::I16},
    {"torch.int8", GlobalKind::DTypeTag, DType::I8},
    {"torch.uint8", GlobalKind::DTypeTag, DType::U8},
    {"torch.uint16", GlobalKind::DTypeTag, DType::U16},
    {"torch.uint32", GlobalKind::DTypeTag, DType::U32},
    {"torch.uint64", GlobalKind::DTypeTag, DType::U64},
    {"torch.bool", GlobalKind::DTypeTag, DType::BOOL},
};

inline const AllowedGlobal& allowed(const Values& v, Ref r) {
  return kAllowedGlobals[static_cast<size_t>(v.get(r).number)];
}

inline bool is_global(const Values& v, Ref r, GlobalKind kind) {
  return v.get(r).kind == Kind::Global && allowed(v, r).kind == kind;
}

// What one entry of storage_index_ costs besides its key: node and bucket (see Values::charge).
inline constexpr size_t kHashEntryBytes = 48;

}  // namespace grouplin::pickle
