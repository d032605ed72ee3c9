// Private: the torch side of the restricted pickle machine. The few globals a state-dict pickle
// may name, and what calling them builds, done here in C++: nothing is imported or called.
//
//   TorchBuilder torch(values, cursor, limits);
//   Ref fn = torch.global("torch._utils", "_rebuild_tensor_v2");   // a tag, not a function
//   Ref tensor = torch.reduce(fn, args);                           // a TensorRef, checked
//   PickledStateDict result = torch.finish(top_level_dict);
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "io/formats/pickle_machine.hpp"
#include "io/formats/pickle_opcodes.hpp"
#include "io/formats/pickle_values.hpp"

namespace grouplin::pickle {

class TorchBuilder {
 public:
  // `values`, `cursor` and `limits` must outlive the builder.
  TorchBuilder(Values& values, const Cursor& cursor, const PickleLimits& limits);

  // GLOBAL module.name: a Global value when the name is allowed; UnsupportedDType for harmless
  // torch element types GroupLin has no dtype for (complex, quantized, fnuz float8), and
  // ForbiddenGlobal for everything else.
  Ref global(std::string_view module, std::string_view name);
  // BINPERSID: the storage that the persistent id ('storage', type, key, location, numel) names.
  Ref persistent_id(Ref id);
  // REDUCE fn(*args) for an allowed fn: OrderedDict(), _rebuild_tensor_v2/v3 (a tensor, checked
  // to lie inside its storage), _rebuild_parameter (the tensor itself).
  Ref reduce(Ref fn, Ref args);
  // NEWOBJ cls(*args): OrderedDict.__new__(OrderedDict), TransformerEngine's DType and
  // MXFP8Quantizer, and the inert data classes (an Object, never constructed).
  Ref new_object(Ref cls, Ref args);
  // BUILD: the attribute dict torch gives an OrderedDict (`_metadata`, ignored), TE's enum code
  // and quantizer fields, an inert object's state (dropped).
  void build(Ref instance, Ref state);
  // The value STOP returned, as a state dict: a dict of str -> tensor (the inner one under `key`
  // when given: run_pickle).
  PickledStateDict finish(Ref result, std::string_view key);

 private:
  Ref rebuild_tensor(std::span<const Ref> args, bool v3);
  // TransformerEngine's Float8Tensor from (data, fp8_dtype, fp8_scale_inv, dtype[, shape[,
  // data_transpose]]) as each release wrote it (`legacy`: through
  // Float8Tensor._make_in_reduce_ex): a tensor of FP8 codes in the logical shape, remembered with
  // its scale.
  Ref float8_tensor(std::span<const Ref> args, bool legacy);
  // TransformerEngine's MXFP8Tensor from (rowwise_data, rowwise_scale_inv, columnwise_data,
  // columnwise_scale_inv, fp8_dtype, dtype[, shape[, quantizer[, with_gemm_swizzled_scales]]])
  // as each release wrote it (`legacy`: through MXFP8Tensor._make_in_reduce_ex, 6 to 9
  // arguments; the module-level function of TE 2.16 on, 8 or 9): the row-wise codes, remembered
  // with their E8M0 scales unpadded (and to be unswizzled); the column-wise copy is dropped.
  Ref mxfp8_tensor(std::span<const Ref> args, bool legacy);
  // The dict of tensors `result` is, or the inner dict of tensors of a training checkpoint
  // ({"model": sd, ...}; said in a note): the one under `key`, else the only one
  // (SeveralStateDicts for several).
  Ref inner_state_dict(Ref result, std::string_view key, PickledStateDict& out);
  // A value that may lie beside the tensors and is skipped: None, bool, int, float, str, bytes,
  // an inert object (io.BytesIO, argparse.Namespace, numpy data).
  static bool is_plain(Kind k);
  // t appended to the tensors, as a Tensor value.
  Ref push_tensor(TensorRef t);
  // The tensor at r, of one-byte elements (FP8 codes, MX scales), or nullptr for None;
  // InvalidPickle naming `fn` and the argument `what` otherwise.
  const TensorRef* codes_or_none(Ref r, std::string_view fn, const char* what) const;
  // How a TransformerEngine release numbered its DType: float8 e4m3 and e5m2 were 6 and 7 up to
  // TE 2.3 and are 7 and 8 from TE 2.4 (kInt16 came in at 1). The legacy 5-argument form was
  // written by TE 2.0-2.15, on both sides of the change.
  enum class TeCodes : uint8_t { UpTo2_3, From2_4, Either };
  // `codes` as FP8 of TE's dtype code (its dtype decided at finish), remembered with the tensor
  // of its scales.
  Ref push_fp8(TensorRef codes, int64_t te_code, TeCodes numbering, size_t scale,
               bool dropped_columnwise);
  // A Global value for the allowed global `name`.
  Ref make_global(std::string_view name);
  // The int >= 0 at `ref`; InvalidPickle naming `what` (and "[index]" when one is given)
  // otherwise. The name is built only for the message: a rank-64 tuple rebuilt from the memo
  // again and again must not cost 64 strings each time.
  int64_t expect_int(Ref ref, std::string_view what, size_t index = SIZE_MAX) const;
  // A tuple of ints >= 0, at most max_rank of them.
  std::vector<int64_t> expect_int_tuple(Ref ref, std::string_view what) const;

  Values& values_;
  const Cursor& cursor_;
  const PickleLimits& limits_;
  std::vector<StorageRef> storages_;
  std::unordered_map<std::string, size_t> storage_index_;
  std::vector<TensorRef> tensors_;
  // Float8Tensors: the tensor of codes, its scale tensor and TE's dtype code (checked at finish,
  // where the entry's key can be named).
  struct Float8Ref {
    size_t tensor;
    size_t scale;
    int64_t te_code;
    TeCodes numbering;
    bool dropped_columnwise = false;  // an MXFP8Tensor's column-wise copy was left out
  };
  std::vector<Float8Ref> float8_;
  std::unordered_map<size_t, size_t> float8_of_tensor_;  // tensor index -> float8_ index
};

}  // namespace grouplin::pickle
