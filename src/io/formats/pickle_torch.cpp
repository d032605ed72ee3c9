// The torch reconstructors of the pickle machine (see io/pickle_torch.hpp); TransformerEngine's
// FP8 tensors are built in pickle_te.cpp.
#include "io/formats/pickle_torch.hpp"

#include <cstdint>

#include "grouplin/error.hpp"
#include "io/formats/pickle_globals.hpp"

namespace grouplin::pickle {
namespace {

// Harmless torch element types with no GroupLin dtype: refused with UnsupportedDType.
// clang-format off
constexpr std::string_view kUnsupportedTypes[] = {
    "torch.ComplexFloatStorage", "torch.ComplexDoubleStorage", "torch.QInt8Storage",
    "torch.QUInt8Storage", "torch.QInt32Storage", "torch.QUInt4x2Storage", "torch.QUInt2x4Storage",
    "torch.complex32", "torch.complex64", "torch.complex128", "torch.float8_e4m3fnuz",
    "torch.float8_e5m2fnuz", "torch.float4_e2m1fn_x2", "torch.bits8",
    "torch.bits16", "torch.bits1x8", "torch.bits2x4", "torch.bits4x2", "torch.qint8",
    "torch.quint8", "torch.qint32", "torch.quint4x2", "torch.quint2x4",
};
// clang-format on

// Heap bytes of a TensorRef's vectors.
size_t vector_bytes(const TensorRef& t) {
  return (t.shape.capacity() + t.stride.capacity()) * sizeof(int64_t);
}

}  // namespace

TorchBuilder::TorchBuilder(Values& values, const Cursor& cursor, const PickleLimits& limits)
    : values_(values), cursor_(cursor), limits_(limits) {}

Ref TorchBuilder::make_global(std::string_view name) {
  for (size_t i = 0; i < std::size(kAllowedGlobals); ++i) {
    if (kAllowedGlobals[i].name != name) continue;
    Ref r = values_.make(Kind::Global);
    values_.get(r).number = static_cast<int64_t>(i);
    return r;
  }
  cursor_.fail(ErrorCode::ForbiddenGlobal, "forbidden global " + quote(name));
}

Ref TorchBuilder::global(std::string_view module, std::string_view name) {
  std::string full(module);
  full += '.';
  full += name;
  for (const AllowedGlobal& g : kAllowedGlobals) {
    if (g.name == full) return make_global(full);
  }
  for (std::string_view u : kUnsupportedTypes) {
    if (u == full) {
      cursor_.fail(ErrorCode::UnsupportedDType,
                   "global " + full + ": GroupLin has no such element type");
    }
  }
  cursor_.fail(ErrorCode::ForbiddenGlobal,
               "forbidden global " + quote(full) +
                   ": GroupLin runs nothing from a file and reads only tensors and plain data "
                   "(docs/pt-format.md); a training checkpoint whose extra data names other "
                   "classes reads once its state dict is saved alone (torch.save(ckpt[\"model\"], "
                   "\"model.pt\"))");
}

int64_t TorchBuilder::expect_int(Ref ref, std::string_view what, size_t index) const {
  const Value& o = values_.get(ref);
  if (o.kind == Kind::Int && o.number >= 0) return o.number;
  std::string name(what);
  if (index != SIZE_MAX) {  // appends: GCC 12 warns (-Wrestrict) falsely on "[" + std::string
    name += '[';
    name += std::to_string(index);
    name += ']';
  }
  if (o.kind != Kind::Int)
    cursor_.invalid(name + " is a " + kind_name(o.kind) + ", expected an int");
  cursor_.invalid(name + " is negative (" + std::to_string(o.number) + ")");
}

std::vector<int64_t> TorchBuilder::expect_int_tuple(Ref ref, std::string_view what) const {
  const Value& o = values_.get(ref);
  if (o.kind != Kind::Tuple) {
    cursor_.invalid(std::string(what) + " is a " + kind_name(o.kind) + ", expected a tuple");
  }
  std::span<const Ref> items = values_.items(ref);
  if (items.size() > limits_.max_rank) {
    cursor_.over(std::string(what) + " has " + std::to_string(items.size()) + " dimensions",
                 limits_.max_rank);
  }
  values_.spend(items.size(), "tensor sizes and strides");
  std::vector<int64_t> out;
  out.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) out.push_back(expect_int(items[i], what, i));
  return out;
}

Ref TorchBuilder::persistent_id(Ref pid) {
  const Value& t = values_.get(pid);
  std::span<const Ref> id = t.kind == Kind::Tuple ? values_.items(pid) : std::span<const Ref>();
  if (id.size() != 5 || values_.get(id[0]).kind != Kind::String ||
      values_.text(id[0]) != "storage") {
    cursor_.invalid("persistent id is not ('storage', type, key, location, numel)");
  }
  const Ref type = id[1], key = id[2], location = id[3];
  if (!is_global(values_, type, GlobalKind::StorageType)) {
    const Value& v = values_.get(type);
    std::string what = "persistent id names a ";  // by appends: GCC 12 warns falsely on operator+
    what += kind_name(v.kind);
    if (v.kind == Kind::Global) {
      what += ' ';
      what += allowed(values_, type).name;
    }
    cursor_.invalid(what + ", expected a torch storage type");
  }
  const AllowedGlobal& storage_type = allowed(values_, type);
  const bool key_is_string = values_.get(key).kind == Kind::String;
  // The key is checked, copied and hashed: a memoized persistent id costs that every time.
  values_.spend(1 + (key_is_string ? values_.get(key).aux / 8 : 0), "storage keys");
  const std::string key_text(key_is_string ? values_.text(key) : std::string_view());
  bool key_ok = key_is_string && !key_text.empty() && key_text.size() <= 64;
  for (char c : key_text) {
    key_ok = key_ok && ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
                        (c >= 'A' && c <= 'Z') || c == '_');
  }
  if (!key_ok) {
    cursor_.invalid("storage key " + quote(key_text) + " is not 1-64 letters, digits or '_'");
  }
  if (values_.get(location).kind != Kind::String) cursor_.invalid("storage location is not a str");
  const int64_t numel = expect_int(id[4], "storage \"" + key_text + "\" numel");
  if (static_cast<uint64_t>(numel) > SIZE_MAX / dtype_size(storage_type.dtype)) {
    cursor_.fail(ErrorCode::SizeOverflow, "storage \"" + key_text + "\" of " +
                                              std::to_string(numel) +
                                              " elements does not fit in memory");
  }
  const std::string type_name(storage_type.name);
  size_t index;
  auto it = storage_index_.find(key_text);
  if (it == storage_index_.end()) {
    index = storages_.size();
    const std::string location_text(values_.text(location));
    values_.grow(storages_, "storages");
    values_.charge(kHashEntryBytes + 2 * key_text.size() + type_name.size() + location_text.size(),
                   "storages");
    storages_.push_back(
        {key_text, type_name, storage_type.dtype, storage_type.untyped, numel, location_text});
    storage_index_.emplace(key_text, index);
  } else {
    index = it->second;
    const StorageRef& s = storages_[index];
    if (s.type != type_name || s.numel != numel) {
      cursor_.invalid("storage \"" + key_text + "\" declared as " + s.type + " of " +
                      std::to_string(s.numel) + " and as " + type_name + " of " +
                      std::to_string(numel));
    }
  }
  Ref ref = values_.make(Kind::Storage);
  values_.get(ref).number = static_cast<int64_t>(index);
  return ref;
}

Ref TorchBuilder::rebuild_tensor(std::span<const Ref> args, bool v3) {
  const std::string_view fn = v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2";
  const size_t base = v3 ? 7 : 6;
  if (args.size() != base && args.size() != base + 1) {
    cursor_.invalid(std::string(fn) + " called with " + std::to_string(args.size()) +
                    " arguments, expected " + std::to_string(base) + " or " +
                    std::to_string(base + 1));
  }
  const Value& st = values_.get(args[0]);
  if (st.kind != Kind::Storage)
    cursor_.invalid(std::string(fn) + ": storage argument is a " + kind_name(st.kind));
  const auto storage_index = static_cast<size_t>(st.number);
  const StorageRef& s = storages_[storage_index];
  TensorRef t;
  t.storage = storage_index;
  t.dtype = s.dtype;
  t.storage_offset = expect_int(
      args[1], v3 ? "_rebuild_tensor_v3: storage_offset" : "_rebuild_tensor_v2: storage_offset");
  t.shape = expect_int_tuple(args[2], v3 ? "_rebuild_tensor_v3: size" : "_rebuild_tensor_v2: size");
  t.stride =
      expect_int_tuple(args[3], v3 ? "_rebuild_tensor_v3: stride" : "_rebuild_tensor_v2: stride");
  if (t.stride.size() != t.shape.size()) {
    cursor_.invalid(std::string(fn) + ": size " + shape_to_string(t.shape) + " and stride " +
                    shape_to_string(t.stride) + " differ in rank");
  }
  if (values_.get(args[4]).kind != Kind::Bool)
    cursor_.invalid(std::string(fn) + ": requires_grad is not a bool");
  if (values_.get(args[5]).kind != Kind::Dict)
    cursor_.invalid(std::string(fn) + ": backward_hooks is not a dict");
  if (v3) {
    if (!is_global(values_, args[6], GlobalKind::DTypeTag)) {
      cursor_.invalid(std::string(fn) + ": dtype argument is a " +
                      kind_name(values_.get(args[6]).kind));
    }
    const AllowedGlobal& d = allowed(values_, args[6]);
    if (!s.untyped && s.dtype != d.dtype) {
      cursor_.invalid(std::string(fn) + ": dtype " + std::string(d.name) + " on a " + s.type);
    }
    t.dtype = d.dtype;
  }
  if (args.size() == base + 1) {
    Kind k = values_.get(args[base]).kind;
    if (k != Kind::None && k != Kind::Dict)
      cursor_.invalid(std::string(fn) + ": metadata is a " + kind_name(k));
  }

  // The elements must lie inside the storage: offset + sum((size_i - 1) * stride_i) < capacity.
  const auto esize = static_cast<int64_t>(dtype_size(t.dtype));
  const int64_t capacity = static_cast<int64_t>(s.nbytes()) / esize;
  // Described only for a message: formatting 128 numbers per rebuild was most of the time a
  // memoized rank-64 tensor rebuilt again and again took.
  auto what = [&t] {
    return std::string(dtype_name(t.dtype)) + " tensor of size " + shape_to_string(t.shape) +
           ", stride " + shape_to_string(t.stride) + ", offset " + std::to_string(t.storage_offset);
  };
  values_.spend(2 * t.shape.size(), "tensor bounds");  // the two loops below
  bool empty = false;
  int64_t last = t.storage_offset;
  for (size_t d = 0; d < t.shape.size(); ++d) {
    if (t.shape[d] == 0) empty = true;
    int64_t reach;
    if (t.shape[d] > 0 && (__builtin_mul_overflow(t.shape[d] - 1, t.stride[d], &reach) ||
                           __builtin_add_overflow(last, reach, &last))) {
      cursor_.fail(ErrorCode::SizeOverflow, what() + " overflows 64-bit indexing");
    }
  }
  int64_t numel = 1;
  for (int64_t d : t.shape) {
    if (__builtin_mul_overflow(numel, d, &numel)) {
      cursor_.fail(ErrorCode::SizeOverflow, what() + " has more than 2^63 elements");
    }
  }
  if (empty ? t.storage_offset > capacity : last >= capacity) {
    cursor_.fail(ErrorCode::StorageTooSmall,
                 what() + " reaches element " + std::to_string(empty ? t.storage_offset : last) +
                     " of storage \"" + s.key + "\" (" + s.type + ") that holds " +
                     std::to_string(capacity) + " elements of " + std::string(dtype_name(t.dtype)));
  }
  return push_tensor(std::move(t));
}

Ref TorchBuilder::push_tensor(TensorRef t) {
  values_.grow(tensors_, "tensors");
  values_.charge(vector_bytes(t), "tensors");
  tensors_.push_back(std::move(t));
  Ref ref = values_.make(Kind::Tensor);
  values_.get(ref).number = static_cast<int64_t>(tensors_.size() - 1);
  return ref;
}

Ref TorchBuilder::reduce(Ref fn_ref, Ref args_ref) {
  const Value& fn = values_.get(fn_ref);
  const Value& args = values_.get(args_ref);
  if (fn.kind != Kind::Global) cursor_.invalid("REDUCE calls a " + std::string(kind_name(fn.kind)));
  if (args.kind != Kind::Tuple) {
    cursor_.invalid("REDUCE arguments are a " + std::string(kind_name(args.kind)));
  }
  const AllowedGlobal& g = allowed(values_, fn_ref);
  // No allowed call takes more than 9 arguments; refusing longer tuples before copying keeps a
  // pickle that REDUCEs one huge memoized tuple again and again from costing quadratic time.
  std::span<const Ref> a = values_.items(args_ref);
  if (a.size() > 9) {
    cursor_.invalid(std::string(g.name) + " called with " + std::to_string(a.size()) +
                    " arguments");
  }
  values_.spend(a.size(), "call arguments");
  const std::vector<Ref> copy(a.begin(), a.end());  // items() may move as values are made
  switch (g.kind) {
    case GlobalKind::OrderedDict: {
      if (!copy.empty()) {
        cursor_.invalid("collections.OrderedDict called with " + std::to_string(copy.size()) +
                        " arguments; only OrderedDict() is accepted");
      }
      Ref d = values_.make_container(Kind::Dict, {});
      values_.get(d).ordered = true;
      return d;
    }
    case GlobalKind::RebuildTensorV2:
      return rebuild_tensor(copy, false);
    case GlobalKind::RebuildTensorV3:
      return rebuild_tensor(copy, true);
    case GlobalKind::RebuildParameter:
      if (copy.size() != 3 || values_.get(copy[0]).kind != Kind::Tensor ||
          values_.get(copy[1]).kind != Kind::Bool) {
        cursor_.invalid("_rebuild_parameter expects (tensor, requires_grad, hooks)");
      }
      return copy[0];
    case GlobalKind::TeFloat8Tensor:
      return float8_tensor(copy, false);
    case GlobalKind::TeFloat8TensorLegacy:
      return float8_tensor(copy, true);
    case GlobalKind::TeMxfp8Tensor:
      return mxfp8_tensor(copy, false);
    case GlobalKind::TeMxfp8TensorLegacy:
      return mxfp8_tensor(copy, true);
    case GlobalKind::Getattr:
      // TE >= 2.17's DType (an IntEnum), which Python >= 3.11 pickles by member name:
      // getattr(DType, 'kFloat8E4M3'). Only its FP8 members are read.
      if (copy.size() == 2 && is_global(values_, copy[0], GlobalKind::TeDType) &&
          values_.get(copy[1]).kind == Kind::String) {
        const std::string_view member = values_.text(copy[1]);
        if (member != "kFloat8E4M3" && member != "kFloat8E5M2") {
          cursor_.invalid("TransformerEngine DType member " + quote(std::string(member)) +
                          "; only kFloat8E4M3 and kFloat8E5M2 are FP8 weights' dtypes");
        }
        Ref d = values_.make(Kind::TeDType);
        values_.get(d).number = member == "kFloat8E4M3" ? 7 : 8;  // TE 2.17's values
        values_.get(d).aux = 1;
        return d;
      }
      // Else only the legacy routes to Float8Tensor's and MXFP8Tensor's reconstructors:
      // getattr(cls, '_make_in_reduce_ex'). Any other attribute of anything could be any function.
      {
        const bool float8 =
            copy.size() == 2 && is_global(values_, copy[0], GlobalKind::TeFloat8TensorClass);
        const bool mxfp8 =
            copy.size() == 2 && is_global(values_, copy[0], GlobalKind::TeMxfp8TensorClass);
        if ((!float8 && !mxfp8) || values_.get(copy[1]).kind != Kind::String ||
            values_.text(copy[1]) != "_make_in_reduce_ex") {
          cursor_.fail(ErrorCode::ForbiddenGlobal,
                       "getattr is accepted only as getattr(Float8Tensor or MXFP8Tensor, "
                       "'_make_in_reduce_ex') and getattr(DType, 'kFloat8E4M3' or "
                       "'kFloat8E5M2') of TransformerEngine");
        }
        return make_global(
            float8
                ? "transformer_engine.pytorch.tensor.float8_tensor.Float8Tensor._make_in_reduce_ex"
                : "transformer_engine.pytorch.tensor.mxfp8_tensor.MXFP8Tensor._make_in_reduce_ex");
      }
    case GlobalKind::TeDType: {  // DType(code): the IntEnum, or pybind11's with TE's __reduce__
      if (copy.size() != 1) cursor_.invalid("TransformerEngine DType called without one code");
      Ref d = values_.make(Kind::TeDType);
      const int64_t code = expect_int(copy[0], "TransformerEngine DType code");
      if (code < 0) cursor_.invalid("TransformerEngine DType code " + std::to_string(code));
      values_.get(d).number = code;
      return d;
    }
    case GlobalKind::InertClass: {  // data beside the tensors: an object named by its class
      Ref o = values_.make(Kind::Object);
      const bool array = !copy.empty() && values_.get(copy[0]).kind == Kind::Global;  // ndarray
      values_.get(o).number = values_.get(array ? copy[0] : fn_ref).number;
      return o;
    }
    case GlobalKind::CodecsEncode:  // how protocol 2 spells bytes: encode(str, 'latin1')
      if (copy.size() != 2 || values_.get(copy[0]).kind != Kind::String ||
          values_.get(copy[1]).kind != Kind::String || values_.text(copy[1]) != "latin1") {
        cursor_.invalid("_codecs.encode is accepted only as encode(str, 'latin1'), bytes");
      }
      return values_.make(Kind::Bytes);
    case GlobalKind::TorchSize:  // torch.Size(tuple): the tuple, checked
      if (copy.size() != 1) cursor_.invalid("torch.Size called without one tuple");
      expect_int_tuple(copy[0], "torch.Size");
      return copy[0];
    case GlobalKind::TeFloat8TensorClass:
    case GlobalKind::TeMxfp8TensorClass:
    case GlobalKind::TeMxfp8Quantizer:
    case GlobalKind::StorageType:
    case GlobalKind::DTypeTag:
      break;
  }
  cursor_.invalid("calling " + std::string(g.name) + " is not supported");
}

Ref TorchBuilder::new_object(Ref cls, Ref args) {
  const bool no_args = values_.get(args).kind == Kind::Tuple && values_.items(args).empty();
  if (is_global(values_, cls, GlobalKind::TeMxfp8Quantizer) && no_args) {
    return values_.make(Kind::TeQuantizer);  // its fields come with BUILD, checked there
  }
  if (is_global(values_, cls, GlobalKind::InertClass) && no_args) {
    Ref o = values_.make(Kind::Object);  // its state comes with BUILD and is dropped
    values_.get(o).number = values_.get(cls).number;
    return o;
  }
  if (is_global(values_, cls, GlobalKind::TeDType) && no_args) {
    // A pybind11 enum as pybind11 pickles it (TE 1.2-2.15): DType.__new__(DType), then BUILD
    // with its code. Until then it has none.
    Ref d = values_.make(Kind::TeDType);
    values_.get(d).number = -1;
    return d;
  }
  if (!is_global(values_, cls, GlobalKind::OrderedDict) || !no_args) {
    cursor_.invalid(
        "NEWOBJ is only accepted as OrderedDict.__new__(OrderedDict), "
        "MXFP8Quantizer.__new__(MXFP8Quantizer) or DType.__new__(DType) of TransformerEngine, "
        "and for the inert data classes io.BytesIO and argparse.Namespace");
  }
  Ref d = values_.make_container(Kind::Dict, {});
  values_.get(d).ordered = true;
  return d;
}

void TorchBuilder::build(Ref instance, Ref state) {
  Value& inst = values_.get(instance);
  if (inst.kind == Kind::TeDType) {  // pybind11's enum state: its code, set once
    if (inst.number >= 0) cursor_.invalid("BUILD on a TransformerEngine DType that has its code");
    const int64_t code = expect_int(state, "TransformerEngine DType state");
    if (code < 0) cursor_.invalid("TransformerEngine DType code " + std::to_string(code));
    values_.get(instance).number = code;
    return;
  }
  if (inst.kind == Kind::Object) return;  // an inert object's state: parsed, not kept
  if (inst.kind == Kind::TeQuantizer) {
    // A quantizer's named fields (rowwise_usage, columnwise_usage, internal, dtype, ...) are
    // read and ignored; only plain values may be among them.
    if (values_.get(state).kind != Kind::Dict) {
      cursor_.invalid("MXFP8Quantizer state is a " +
                      std::string(kind_name(values_.get(state).kind)) +
                      ", expected a dict of its fields");
    }
    std::span<const Ref> items = values_.items(state);
    for (size_t i = 0; i < items.size(); i += 2) {
      const Kind k = values_.get(items[i]).kind;
      const Kind v = values_.get(items[i + 1]).kind;
      const bool plain = v == Kind::None || v == Kind::Bool || v == Kind::Int || v == Kind::Float ||
                         v == Kind::String || v == Kind::TeDType;
      if (k != Kind::String || !plain) {
        cursor_.invalid("MXFP8Quantizer field " +
                        (k == Kind::String ? quote(values_.text(items[i])) : std::string("key")) +
                        " is a " + kind_name(k == Kind::String ? v : k) +
                        "; only str fields of None, bool, int, float, str or DType are read");
      }
    }
    return;
  }
  if (inst.kind != Kind::Dict || !inst.ordered) {
    cursor_.invalid("BUILD on a " + std::string(kind_name(inst.kind)) +
                    "; only an OrderedDict's attributes can be set");
  }
  if (values_.get(state).kind != Kind::Dict) {
    cursor_.invalid("BUILD state is a " + std::string(kind_name(values_.get(state).kind)) +
                    ", expected a dict");
  }
}

PickledStateDict TorchBuilder::finish(Ref result, std::string_view key) {
  const Value& d = values_.get(result);
  if (d.kind != Kind::Dict) {
    cursor_.invalid("the pickle holds a " + std::string(kind_name(d.kind)) +
                    ", expected a dict of name -> tensor (a state dict)");
  }
  PickledStateDict out;
  out.storages = std::move(storages_);  // the last use of the builder
  // The numbering of the legacy 5-argument Float8Tensors (TE 2.0-2.15): a code only one side of
  // TE 2.4's renumbering writes for FP8 (6 before it, 8 after) tells it for the whole file.
  bool before = false, after = false, either_said = false;
  for (const Float8Ref& f : float8_) {
    if (f.numbering != TeCodes::Either) continue;
    before = before || f.te_code == 6;
    after = after || f.te_code == 8;
  }
  if (before && after) {
    cursor_.invalid(
        "TransformerEngine Float8Tensors with both dtype codes 6 and 8: no release wrote both "
        "(float8 e4m3 was 6 up to TE 2.3, 7 from TE 2.4)");
  }
  const TeCodes either = before ? TeCodes::UpTo2_3 : TeCodes::From2_4;
  const Ref state_dict = inner_state_dict(result, key, out);
  std::span<const Ref> items = values_.items(state_dict);
  std::string skipped;  // plain values beside the tensors, named in one note
  size_t skipped_count = 0;
  for (size_t i = 0; i < items.size(); i += 2) {
    const Value& k = values_.get(items[i]);
    const Value& v = values_.get(items[i + 1]);
    if (k.kind != Kind::String) {
      cursor_.invalid("state dict key is a " + std::string(kind_name(k.kind)));
    }
    // None (TE's _extra_state without FP8), an io.BytesIO (TE 0.12-1.13's), a step count, a
    // flag, a name
    if (is_plain(v.kind)) {
      if (skipped_count++ < 8) {
        skipped += (skipped.empty() ? "" : ", ") + quote(values_.text(items[i])) + " (" +
                   (v.kind == Kind::Object
                        ? std::string(kAllowedGlobals[static_cast<size_t>(v.number)].name)
                        : std::string(kind_name(v.kind))) +
                   ")";
      }
      continue;
    }
    if (v.kind != Kind::Tensor) {
      cursor_.invalid("state dict entry " + quote(values_.text(items[i])) + " is a " +
                      kind_name(v.kind) +
                      ", not a tensor; only name -> tensor dicts are read (plain values beside "
                      "the tensors are skipped)");
    }
    // One tensor may be listed under many names: each copy of it counts.
    const auto index = static_cast<size_t>(v.number);
    const TensorRef& t = tensors_[index];
    values_.spend(1 + k.aux / 8 + 2 * t.shape.size(), "the state dict");
    values_.grow(out.tensors, "the state dict");
    values_.charge(k.aux + vector_bytes(t), "the state dict");
    out.tensors.emplace_back(std::string(values_.text(items[i])), t);
    // A TransformerEngine Float8Tensor: its codes, and its scale beside them as key_scale_inv.
    if (auto it = float8_of_tensor_.find(index); it != float8_of_tensor_.end()) {
      const Float8Ref& f = float8_[it->second];
      const std::string key(values_.text(items[i]));
      const TeCodes n = f.numbering == TeCodes::Either ? either : f.numbering;
      const int64_t e4m3 = n == TeCodes::UpTo2_3 ? 6 : 7;
      if (f.te_code != e4m3 && f.te_code != e4m3 + 1) {
        cursor_.fail(ErrorCode::UnsupportedDType,
                     "state dict entry " + quote(key) +
                         ": a TransformerEngine FP8 tensor of TE dtype code " +
                         std::to_string(f.te_code) + "; expected " + std::to_string(e4m3) +
                         " (float8 e4m3) or " + std::to_string(e4m3 + 1) +
                         " (float8 e5m2), as TransformerEngine " +
                         (n == TeCodes::UpTo2_3 ? "up to 2.3" : "2.4 and later") + " numbers them");
      }
      out.tensors.back().second.dtype = f.te_code == e4m3 ? DType::F8_E4M3 : DType::F8_E5M2;
      if (f.numbering == TeCodes::Either && !before && !after && !either_said) {
        either_said = true;
        values_.grow(out.notes, "the state dict");
        out.notes.push_back(
            {ErrorCode::AmbiguousTeDType, key,
             quote(key) + ": a TransformerEngine tensor in a form written on both sides of "
                          "TE 2.4's renumbering (Float8Tensor with 5 arguments, TE 2.0-2.15; "
                          "MXFP8Tensor with 7, TE 2.3-2.5) with TE dtype code 7, and no other "
                          "code in the file to tell the release: read as float8 e4m3, TE 2.4's "
                          "numbering; TE 2.0-2.3 numbered float8 e5m2 7 (the codes are kept "
                          "byte for byte either way)"});
      }
      values_.grow(out.tensors, "the state dict");
      out.tensors.emplace_back(key + "_scale_inv", tensors_[f.scale]);
      if (f.dropped_columnwise) {
        values_.grow(out.notes, "the state dict");
        out.notes.push_back({ErrorCode::CopyDropped, key,
                             quote(key) +
                                 ": the column-wise copy of this MXFP8Tensor (a second "
                                 "quantization for the transposed GEMM) is left out; its row-wise "
                                 "codes and scales are read"});
      }
    }
  }
  if (skipped_count > 0) {
    values_.grow(out.notes, "the state dict");
    out.notes.push_back(
        {ErrorCode::EntriesSkipped, "",
         std::to_string(skipped_count) +
             (skipped_count == 1 ? " entry beside the tensors is not a tensor and is"
                                 : " entries beside the tensors are not tensors and are") +
             " left out: " + skipped + (skipped_count > 8 ? ", ..." : "")});
  }
  return out;
}

bool TorchBuilder::is_plain(Kind k) {
  return k == Kind::None || k == Kind::Bool || k == Kind::Int || k == Kind::Float ||
         k == Kind::String || k == Kind::Bytes || k == Kind::Object;
}

Ref TorchBuilder::inner_state_dict(Ref result, std::string_view key, PickledStateDict& out) {
  // A state dict holds tensors. A training checkpoint holds one under a key of its own
  // ({"model": sd, "iteration": 7}, Lightning's {"state_dict": sd, "epoch": 3}): the inner dict
  // of tensors is the state dict, and what lies beside it is named in a note.
  std::span<const Ref> items = values_.items(result);
  auto holds_tensors = [&](Ref dict) {
    std::span<const Ref> inner = values_.items(dict);
    for (size_t i = 1; i < inner.size(); i += 2) {
      if (values_.get(inner[i]).kind == Kind::Tensor) return true;
    }
    return false;
  };
  std::vector<size_t> inner;  // top-level keys of dicts of tensors
  for (size_t i = 0; i + 1 < items.size(); i += 2) {
    if (values_.get(items[i + 1]).kind == Kind::Dict && holds_tensors(items[i + 1])) {
      inner.push_back(i);
    }
  }
  auto names = [&] {
    std::string n;
    for (size_t i : inner) {
      const bool str = values_.get(items[i]).kind == Kind::String;
      n += (n.empty() ? "" : ", ") + (str ? quote(values_.text(items[i])) : std::string("?"));
    }
    return n.empty() ? std::string("none") : n;
  };
  size_t chosen = SIZE_MAX;
  if (!key.empty()) {
    for (size_t i : inner) {
      if (values_.get(items[i]).kind == Kind::String && values_.text(items[i]) == key) chosen = i;
    }
    if (chosen == SIZE_MAX) {
      cursor_.fail(ErrorCode::MissingKey,
                   "the state dict asked for, " + quote(std::string(key)) +
                       ", is not a dict of tensors at the top level of the pickle; its dicts of "
                       "tensors: " +
                       names());
    }
  } else {
    if (holds_tensors(result)) return result;
    if (inner.empty()) return result;  // no tensors at all: an empty state dict, or refused
    if (inner.size() > 1) {
      cursor_.fail(ErrorCode::SeveralStateDicts,
                   "the pickle holds no tensors at its top level but several dicts of them (" +
                       names() +
                       "), as a training checkpoint of several models does; name the one to read "
                       "(grouplin --state-dict KEY, PtReadOptions::state_dict_key)");
    }
    chosen = inner[0];
  }
  const Ref k = items[chosen];
  if (values_.get(k).kind != Kind::String) cursor_.invalid("the state dict's key is not a str");
  std::string beside;
  for (size_t i = 0; i + 1 < items.size(); i += 2) {
    if (i == chosen) continue;
    const Value& b = values_.get(items[i]);
    beside +=
        (beside.empty() ? "" : ", ") +
        (b.kind == Kind::String ? quote(values_.text(items[i])) : std::string(kind_name(b.kind)));
  }
  values_.grow(out.notes, "the state dict");
  out.notes.push_back({ErrorCode::EntriesSkipped, std::string(values_.text(k)),
                       "a training checkpoint: its state dict is the dict under " +
                           quote(values_.text(k)) +
                           (key.empty() ? " (its only dict of tensors)" : " (asked for)") +
                           (beside.empty() ? "" : "; left out beside it: " + beside)});
  return items[chosen + 1];
}

}  // namespace grouplin::pickle
