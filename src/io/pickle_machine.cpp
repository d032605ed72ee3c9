// The restricted pickle machine (see io/pickle_machine.hpp). Values live in one arena and refer
// to each other by index, so reference cycles made through the memo cost nothing and leak
// nothing; no code walks values recursively.
#include "io/pickle_machine.hpp"

#include <cstdio>
#include <cstring>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "core/utf8.hpp"
#include "grouplin/error.hpp"

namespace grouplin::pickle {
namespace {

// clang-format off
enum class Kind : uint8_t { None, Bool, Int, Float, String, Tuple, List, Dict, Set, Global, Storage, Tensor };
constexpr const char* kKindNames[] = {"None", "bool", "int", "float", "str", "tuple", "list", "dict",
                                      "set", "global", "storage", "tensor"};
// clang-format on

const char* kind_name(Kind k) { return kKindNames[static_cast<size_t>(k)]; }

// What an allowed global stands for.
// clang-format off
enum class GlobalKind : uint8_t { OrderedDict, RebuildTensorV2, RebuildTensorV3, RebuildParameter, StorageType, DTypeTag };
// clang-format on

struct AllowedGlobal {
  std::string_view name;
  GlobalKind kind;
  DType dtype = DType::U8;
  bool untyped = false;
};

constexpr AllowedGlobal kAllowedGlobals[] = {
    {"collections.OrderedDict", GlobalKind::OrderedDict},
    {"torch._utils._rebuild_tensor_v2", GlobalKind::RebuildTensorV2},
    {"torch._utils._rebuild_tensor_v3", GlobalKind::RebuildTensorV3},
    {"torch._utils._rebuild_parameter", GlobalKind::RebuildParameter},
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
    {"torch.UntypedStorage", GlobalKind::StorageType, DType::U8, true},
    {"torch.float32", GlobalKind::DTypeTag, DType::F32},
    {"torch.float64", GlobalKind::DTypeTag, DType::F64},
    {"torch.float16", GlobalKind::DTypeTag, DType::F16},
    {"torch.bfloat16", GlobalKind::DTypeTag, DType::BF16},
    {"torch.float8_e4m3fn", GlobalKind::DTypeTag, DType::F8_E4M3},
    {"torch.float8_e5m2", GlobalKind::DTypeTag, DType::F8_E5M2},
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

// Harmless torch element types with no GroupLin dtype: refused with UnsupportedDType.
// clang-format off
constexpr std::string_view kUnsupportedTypes[] = {
    "torch.ComplexFloatStorage", "torch.ComplexDoubleStorage", "torch.QInt8Storage",
    "torch.QUInt8Storage", "torch.QInt32Storage", "torch.QUInt4x2Storage", "torch.QUInt2x4Storage",
    "torch.complex32", "torch.complex64", "torch.complex128", "torch.float8_e4m3fnuz",
    "torch.float8_e5m2fnuz", "torch.float8_e8m0fnu", "torch.float4_e2m1fn_x2", "torch.bits8",
    "torch.bits16", "torch.bits1x8", "torch.bits2x4", "torch.bits4x2", "torch.qint8",
    "torch.quint8", "torch.qint32", "torch.quint4x2", "torch.quint2x4",
};
// clang-format on

// Every pickle opcode by name, for messages about the refused ones too.
struct OpcodeName {
  uint8_t op;
  const char* name;
};

// clang-format off
constexpr OpcodeName kOpcodeNames[] = {
    {'(', "MARK"}, {'.', "STOP"}, {'0', "POP"}, {'1', "POP_MARK"}, {'2', "DUP"}, {'F', "FLOAT"},
    {'I', "INT"}, {'J', "BININT"}, {'K', "BININT1"}, {'L', "LONG"}, {'M', "BININT2"},
    {'N', "NONE"}, {'P', "PERSID"}, {'Q', "BINPERSID"}, {'R', "REDUCE"}, {'S', "STRING"},
    {'T', "BINSTRING"}, {'U', "SHORT_BINSTRING"}, {'V', "UNICODE"}, {'X', "BINUNICODE"},
    {'a', "APPEND"}, {'b', "BUILD"}, {'c', "GLOBAL"}, {'d', "DICT"}, {'}', "EMPTY_DICT"},
    {'e', "APPENDS"}, {'g', "GET"}, {'h', "BINGET"}, {'i', "INST"}, {'j', "LONG_BINGET"},
    {'l', "LIST"}, {']', "EMPTY_LIST"}, {'o', "OBJ"}, {'p', "PUT"}, {'q', "BINPUT"},
    {'r', "LONG_BINPUT"}, {'s', "SETITEM"}, {'t', "TUPLE"}, {')', "EMPTY_TUPLE"},
    {'u', "SETITEMS"}, {'G', "BINFLOAT"}, {0x80, "PROTO"}, {0x81, "NEWOBJ"}, {0x82, "EXT1"},
    {0x83, "EXT2"}, {0x84, "EXT4"}, {0x85, "TUPLE1"}, {0x86, "TUPLE2"}, {0x87, "TUPLE3"},
    {0x88, "NEWTRUE"}, {0x89, "NEWFALSE"}, {0x8a, "LONG1"}, {0x8b, "LONG4"}, {'B', "BINBYTES"},
    {'C', "SHORT_BINBYTES"}, {0x8c, "SHORT_BINUNICODE"}, {0x8d, "BINUNICODE8"},
    {0x8e, "BINBYTES8"}, {0x8f, "EMPTY_SET"}, {0x90, "ADDITEMS"}, {0x91, "FROZENSET"},
    {0x92, "NEWOBJ_EX"}, {0x93, "STACK_GLOBAL"}, {0x94, "MEMOIZE"}, {0x95, "FRAME"},
    {0x96, "BYTEARRAY8"}, {0x97, "NEXT_BUFFER"}, {0x98, "READONLY_BUFFER"},
};
// clang-format on

const char* opcode_name(uint8_t op) {
  for (const OpcodeName& o : kOpcodeNames) {
    if (o.op == op) return o.name;
  }
  return "unknown";
}

}  // namespace

namespace {

struct Object {
  Kind kind = Kind::None;
  bool ordered = false;  // Dict: a collections.OrderedDict
  bool untyped = false;  // Global storage type: torch.UntypedStorage
  GlobalKind global = GlobalKind::OrderedDict;
  DType dtype = DType::U8;  // Global storage type or dtype tag
  uint32_t depth = 0;       // containers nested inside (0 for scalars)
  int64_t number = 0;       // Bool, Int; Storage and Tensor: index into their tables
  double real = 0;
  std::string text;             // String; Global: "module.name"
  std::vector<uint32_t> items;  // Tuple, List, Set; Dict: key, value, key, value, ...
};

class Machine {
 public:
  Machine(std::span<const std::byte> pickle, const PickleLimits& limits)
      : p_(pickle), limits_(limits) {}

  PickledStateDict run();

 private:
  [[noreturn]] void fail(ErrorCode code, const std::string& what) const {
    throw Error(code, "offset " + std::to_string(at_) + ": " + what);
  }
  [[noreturn]] void invalid(const std::string& what) const { fail(ErrorCode::InvalidPickle, what); }
  [[noreturn]] void over(const std::string& what, size_t limit) const {
    fail(ErrorCode::PickleLimitExceeded, what + " (limit " + std::to_string(limit) + ")");
  }
  std::string op() const { return opcode_name(op_); }

  // Reading arguments.
  const std::byte* take(size_t n) {
    if (n > p_.size() - pos_) {
      fail(ErrorCode::Truncated, op() + " needs " + std::to_string(n) + " bytes, " +
                                     std::to_string(p_.size() - pos_) + " left");
    }
    const std::byte* p = p_.data() + pos_;
    pos_ += n;
    return p;
  }
  uint64_t take_le(size_t n) {
    const std::byte* p = take(n);
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= std::to_integer<uint64_t>(p[i]) << (8 * i);
    return v;
  }
  std::string take_line() {
    size_t end = pos_;
    while (end < p_.size() && p_[end] != std::byte{'\n'}) {
      if (end - pos_ >= limits_.max_string) {
        over("GLOBAL line too long", limits_.max_string);
      }
      ++end;
    }
    if (end == p_.size()) fail(ErrorCode::Truncated, "GLOBAL line has no end");
    std::string s(reinterpret_cast<const char*>(p_.data() + pos_), end - pos_);
    pos_ = end + 1;
    return s;
  }
  std::string take_string(uint64_t n) {
    if (n > limits_.max_string) {
      over(op() + " string of " + std::to_string(n) + " bytes", limits_.max_string);
    }
    const std::byte* p = take(static_cast<size_t>(n));
    std::string s(reinterpret_cast<const char*>(p), static_cast<size_t>(n));
    if (!utf8::is_valid(s, /*allow_surrogates=*/true))
      invalid(op() + " string is not UTF-8: " + quote(s));
    return s;
  }

  // The arena and the stack.
  uint32_t make(Kind kind) {
    if (objects_.size() >= limits_.max_objects) {
      over("too many values", limits_.max_objects);
    }
    objects_.emplace_back();
    objects_.back().kind = kind;
    return static_cast<uint32_t>(objects_.size() - 1);
  }
  Object& obj(uint32_t ref) { return objects_[ref]; }
  void push(uint32_t ref) {
    if (stack_.size() >= limits_.max_stack) {
      over("stack too deep", limits_.max_stack);
    }
    stack_.push_back(ref);
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  uint32_t pop() {
    if (stack_.size() <= floor()) fail(ErrorCode::PickleStackError, op() + " on an empty stack");
    uint32_t ref = stack_.back();
    stack_.pop_back();
    return ref;
  }
  uint32_t top() {
    if (stack_.size() <= floor()) fail(ErrorCode::PickleStackError, op() + " on an empty stack");
    return stack_.back();
  }
  std::vector<uint32_t> pop_mark() {
    if (marks_.empty()) fail(ErrorCode::PickleStackError, op() + " without a MARK");
    std::vector<uint32_t> items(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()),
                                stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  uint32_t make_container(Kind kind, std::vector<uint32_t> items) {
    uint32_t depth = 1;
    for (uint32_t r : items) depth = std::max(depth, obj(r).depth + 1);
    check_depth(depth);
    uint32_t ref = make(kind);
    obj(ref).items = std::move(items);
    obj(ref).depth = depth;
    return ref;
  }
  void check_depth(uint32_t depth) {
    if (depth > limits_.max_depth) {
      over("containers nested too deep", limits_.max_depth);
    }
  }
  void add_child(uint32_t container, uint32_t child) {
    uint32_t depth = std::max(obj(container).depth, obj(child).depth + 1);
    check_depth(depth);
    obj(container).depth = depth;
    obj(container).items.push_back(child);
  }
  uint32_t make_int(int64_t v) {
    uint32_t ref = make(Kind::Int);
    obj(ref).number = v;
    return ref;
  }

  // Opcode bodies.
  void op_global();
  void set_items(uint32_t dict, const std::vector<uint32_t>& kv);
  void append_items(uint32_t list, const std::vector<uint32_t>& items);
  void op_reduce();
  void op_persid();
  uint32_t rebuild_tensor(const std::vector<uint32_t>& args, bool v3);
  int64_t expect_int(uint32_t ref, const std::string& what);
  std::vector<int64_t> expect_int_tuple(uint32_t ref, const std::string& what);
  PickledStateDict finish(uint32_t result);

  std::span<const std::byte> p_;
  PickleLimits limits_;
  size_t pos_ = 0;
  size_t at_ = 0;  // offset of the opcode being run
  uint8_t op_ = 0;
  std::vector<Object> objects_;
  std::vector<uint32_t> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint32_t, uint32_t> memo_;
  std::unordered_map<uint32_t, std::unordered_set<std::string>> dict_keys_;
  std::vector<StorageRef> storages_;
  std::unordered_map<std::string, size_t> storage_index_;
  std::vector<TensorRef> tensors_;
};

void Machine::op_global() {
  std::string module = take_line();
  std::string name = take_line();
  std::string full = module + "." + name;
  for (const AllowedGlobal& g : kAllowedGlobals) {
    if (g.name == full) {
      uint32_t ref = make(Kind::Global);
      Object& o = obj(ref);
      o.global = g.kind;
      o.dtype = g.dtype;
      o.untyped = g.untyped;
      o.text = full;
      push(ref);
      return;
    }
  }
  for (std::string_view u : kUnsupportedTypes) {
    if (u == full)
      fail(ErrorCode::UnsupportedDType, "global " + full + ": GroupLin has no such element type");
  }
  fail(ErrorCode::ForbiddenGlobal, "forbidden global " + quote(full));
}

void Machine::set_items(uint32_t dict, const std::vector<uint32_t>& kv) {
  if (obj(dict).kind != Kind::Dict) {
    invalid(op() + " on a " + kind_name(obj(dict).kind) + "; only dicts take items");
  }
  if (kv.size() % 2 != 0) invalid(op() + " with an odd number of values");
  auto& keys = dict_keys_[dict];
  for (size_t i = 0; i < kv.size(); i += 2) {
    const Object& k = obj(kv[i]);
    // Built by appends: GCC 12 warns (-Wrestrict) falsely on "s" + std::string.
    std::string id(1, k.kind == Kind::String ? 's' : 'i');
    if (k.kind == Kind::String) {
      id += k.text;
    } else if (k.kind == Kind::Int || k.kind == Kind::Bool) {
      id += std::to_string(k.number);
    } else {
      invalid(op() + " with a " + kind_name(k.kind) + " key; only str and int keys are accepted");
    }
    if (!keys.insert(std::move(id)).second) {
      fail(ErrorCode::DuplicateName,
           op() + " sets key " + quote(k.kind == Kind::String ? k.text : std::to_string(k.number)) +
               " twice");
    }
    add_child(dict, kv[i]);
    add_child(dict, kv[i + 1]);
  }
}

void Machine::append_items(uint32_t list, const std::vector<uint32_t>& items) {
  if (obj(list).kind != Kind::List) {
    invalid(op() + " on a " + kind_name(obj(list).kind) + "; only lists can be appended to");
  }
  for (uint32_t r : items) add_child(list, r);
}

int64_t Machine::expect_int(uint32_t ref, const std::string& what) {
  const Object& o = obj(ref);
  if (o.kind != Kind::Int) invalid(what + " is a " + kind_name(o.kind) + ", expected an int");
  if (o.number < 0) invalid(what + " is negative (" + std::to_string(o.number) + ")");
  return o.number;
}

std::vector<int64_t> Machine::expect_int_tuple(uint32_t ref, const std::string& what) {
  const Object& o = obj(ref);
  if (o.kind != Kind::Tuple) invalid(what + " is a " + kind_name(o.kind) + ", expected a tuple");
  if (o.items.size() > limits_.max_rank) {
    over(what + " has " + std::to_string(o.items.size()) + " dimensions", limits_.max_rank);
  }
  std::vector<int64_t> out;
  out.reserve(o.items.size());
  for (size_t i = 0; i < o.items.size(); ++i) {
    out.push_back(expect_int(o.items[i], what + "[" + std::to_string(i) + "]"));
  }
  return out;
}

void Machine::op_persid() {
  uint32_t pid = pop();
  const Object& t = obj(pid);
  if (t.kind != Kind::Tuple || t.items.size() != 5 || obj(t.items[0]).kind != Kind::String ||
      obj(t.items[0]).text != "storage") {
    invalid("persistent id is not ('storage', type, key, location, numel)");
  }
  const Object& type = obj(t.items[1]);
  const Object& key = obj(t.items[2]);
  const Object& location = obj(t.items[3]);
  if (type.kind != Kind::Global || type.global != GlobalKind::StorageType) {
    invalid("persistent id names a " + std::string(kind_name(type.kind)) + " " + quote(type.text) +
            ", expected a torch storage type");
  }
  bool key_ok = key.kind == Kind::String && !key.text.empty() && key.text.size() <= 64;
  for (char c : key.kind == Kind::String ? key.text : std::string()) {
    key_ok = key_ok && ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
                        (c >= 'A' && c <= 'Z') || c == '_');
  }
  if (!key_ok) {
    invalid("storage key " + quote(key.text) + " is not 1-64 letters, digits or '_'");
  }
  if (location.kind != Kind::String) invalid("storage location is not a str");
  int64_t numel = expect_int(t.items[4], "storage " + quote(key.text) + " numel");
  if (static_cast<uint64_t>(numel) > SIZE_MAX / dtype_size(type.dtype)) {
    fail(ErrorCode::SizeOverflow, "storage " + quote(key.text) + " of " + std::to_string(numel) +
                                      " elements does not fit in memory");
  }
  size_t index;
  auto it = storage_index_.find(key.text);
  if (it == storage_index_.end()) {
    index = storages_.size();
    storages_.push_back({key.text, type.text, type.dtype, type.untyped, numel, location.text});
    storage_index_.emplace(key.text, index);
  } else {
    index = it->second;
    const StorageRef& s = storages_[index];
    if (s.type != type.text || s.numel != numel) {
      invalid("storage " + quote(key.text) + " declared as " + s.type + " of " +
              std::to_string(s.numel) + " and as " + type.text + " of " + std::to_string(numel));
    }
  }
  uint32_t ref = make(Kind::Storage);
  obj(ref).number = static_cast<int64_t>(index);
  push(ref);
}

uint32_t Machine::rebuild_tensor(const std::vector<uint32_t>& args, bool v3) {
  const std::string fn = v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2";
  const size_t base = v3 ? 7 : 6;
  if (args.size() != base && args.size() != base + 1) {
    invalid(fn + " called with " + std::to_string(args.size()) + " arguments, expected " +
            std::to_string(base) + " or " + std::to_string(base + 1));
  }
  const Object& st = obj(args[0]);
  if (st.kind != Kind::Storage) {
    invalid(fn + ": storage argument is a " + kind_name(st.kind));
  }
  const auto storage_index = static_cast<size_t>(st.number);
  const StorageRef& s = storages_[storage_index];
  TensorRef t;
  t.storage = storage_index;
  t.dtype = s.dtype;
  t.storage_offset = expect_int(args[1], fn + ": storage_offset");
  t.shape = expect_int_tuple(args[2], fn + ": size");
  t.stride = expect_int_tuple(args[3], fn + ": stride");
  if (t.stride.size() != t.shape.size()) {
    invalid(fn + ": size " + shape_to_string(t.shape) + " and stride " + shape_to_string(t.stride) +
            " differ in rank");
  }
  if (obj(args[4]).kind != Kind::Bool) invalid(fn + ": requires_grad is not a bool");
  if (obj(args[5]).kind != Kind::Dict) invalid(fn + ": backward_hooks is not a dict");
  if (v3) {
    const Object& d = obj(args[6]);
    if (d.kind != Kind::Global || d.global != GlobalKind::DTypeTag) {
      invalid(fn + ": dtype argument is a " + kind_name(d.kind) + " " + quote(d.text));
    }
    if (!s.untyped && s.dtype != d.dtype) {
      invalid(fn + ": dtype " + d.text + " on a " + s.type);
    }
    t.dtype = d.dtype;
  }
  if (args.size() == base + 1) {
    Kind k = obj(args[base]).kind;
    if (k != Kind::None && k != Kind::Dict) invalid(fn + ": metadata is a " + kind_name(k));
  }

  // The elements must lie inside the storage: offset + sum((size_i - 1) * stride_i) < capacity.
  const auto esize = static_cast<int64_t>(dtype_size(t.dtype));
  const int64_t capacity = static_cast<int64_t>(s.nbytes()) / esize;
  const std::string what = std::string(dtype_name(t.dtype)) + " tensor of size " +
                           shape_to_string(t.shape) + ", stride " + shape_to_string(t.stride) +
                           ", offset " + std::to_string(t.storage_offset);
  bool empty = false;
  int64_t last = t.storage_offset;
  for (size_t d = 0; d < t.shape.size(); ++d) {
    if (t.shape[d] == 0) empty = true;
    int64_t reach;
    if (t.shape[d] > 0 && (__builtin_mul_overflow(t.shape[d] - 1, t.stride[d], &reach) ||
                           __builtin_add_overflow(last, reach, &last))) {
      fail(ErrorCode::SizeOverflow, what + " overflows 64-bit indexing");
    }
  }
  int64_t numel = 1;
  for (int64_t d : t.shape) {
    if (__builtin_mul_overflow(numel, d, &numel))
      fail(ErrorCode::SizeOverflow, what + " has more than 2^63 elements");
  }
  if (empty ? t.storage_offset > capacity : last >= capacity) {
    fail(ErrorCode::StorageTooSmall,
         what + " reaches element " + std::to_string(empty ? t.storage_offset : last) +
             " of storage " + quote(s.key) + " (" + s.type + ") that holds " +
             std::to_string(capacity) + " elements of " + std::string(dtype_name(t.dtype)));
  }
  tensors_.push_back(std::move(t));
  uint32_t ref = make(Kind::Tensor);
  obj(ref).number = static_cast<int64_t>(tensors_.size() - 1);
  return ref;
}

void Machine::op_reduce() {
  uint32_t args_ref = pop();
  uint32_t fn_ref = top();
  const Object& fn = obj(fn_ref);
  const Object& args = obj(args_ref);
  if (fn.kind != Kind::Global) invalid("REDUCE calls a " + std::string(kind_name(fn.kind)));
  if (args.kind != Kind::Tuple)
    invalid("REDUCE arguments are a " + std::string(kind_name(args.kind)));
  // No allowed call takes more than 8 arguments; refusing longer tuples before copying keeps a
  // pickle that REDUCEs one huge memoized tuple again and again from costing quadratic time.
  if (args.items.size() > 8) {
    invalid(fn.text + " called with " + std::to_string(args.items.size()) + " arguments");
  }
  const std::vector<uint32_t> a = args.items;
  uint32_t result = 0;
  switch (fn.global) {
    case GlobalKind::OrderedDict:
      if (!a.empty()) {
        invalid("collections.OrderedDict called with " + std::to_string(a.size()) +
                " arguments; only OrderedDict() is accepted");
      }
      result = make(Kind::Dict);
      obj(result).ordered = true;
      obj(result).depth = 1;
      break;
    case GlobalKind::RebuildTensorV2:
      result = rebuild_tensor(a, false);
      break;
    case GlobalKind::RebuildTensorV3:
      result = rebuild_tensor(a, true);
      break;
    case GlobalKind::RebuildParameter:
      if (a.size() != 3 || obj(a[0]).kind != Kind::Tensor || obj(a[1]).kind != Kind::Bool) {
        invalid("_rebuild_parameter expects (tensor, requires_grad, hooks)");
      }
      result = a[0];
      break;
    case GlobalKind::StorageType:
    case GlobalKind::DTypeTag:
      invalid("calling " + fn.text + " is not supported");
  }
  stack_.back() = result;
}

PickledStateDict Machine::finish(uint32_t result) {
  const Object& d = obj(result);
  if (d.kind != Kind::Dict) {
    invalid("the pickle holds a " + std::string(kind_name(d.kind)) +
            ", expected a dict of name -> tensor (a state dict)");
  }
  PickledStateDict out;
  out.storages = storages_;
  for (size_t i = 0; i < d.items.size(); i += 2) {
    const Object& k = obj(d.items[i]);
    const Object& v = obj(d.items[i + 1]);
    if (k.kind != Kind::String) invalid("state dict key is a " + std::string(kind_name(k.kind)));
    if (v.kind != Kind::Tensor) {
      invalid("state dict entry " + quote(k.text) + " is a " + kind_name(v.kind) +
              ", not a tensor; only flat name -> tensor dicts are read");
    }
    out.tensors.emplace_back(k.text, tensors_[static_cast<size_t>(v.number)]);
  }
  return out;
}

PickledStateDict Machine::run() {
  if (p_.size() > limits_.max_bytes) {
    at_ = 0;
    over("pickle of " + std::to_string(p_.size()) + " bytes", limits_.max_bytes);
  }
  while (true) {
    at_ = pos_;
    if (pos_ >= p_.size()) fail(ErrorCode::Truncated, "the pickle ends without STOP");
    op_ = std::to_integer<uint8_t>(p_[pos_++]);
    switch (op_) {
      case 0x80: {  // PROTO
        uint64_t proto = take_le(1);
        if (proto > 5) invalid("unknown pickle protocol " + std::to_string(proto));
        break;
      }
      case '.': {  // STOP
        uint32_t result = pop();
        if (!stack_.empty() || !marks_.empty()) {
          fail(ErrorCode::PickleStackError, "STOP leaves " + std::to_string(stack_.size()) +
                                                " values and " + std::to_string(marks_.size()) +
                                                " MARKs behind");
        }
        if (pos_ != p_.size()) {
          invalid(std::to_string(p_.size() - pos_) + " bytes after STOP");
        }
        return finish(result);
      }
      case 'c':
        op_global();
        break;
      case 0x81: {  // NEWOBJ
        uint32_t args = pop();
        uint32_t cls = pop();
        if (obj(cls).kind != Kind::Global || obj(cls).global != GlobalKind::OrderedDict ||
            obj(args).kind != Kind::Tuple || !obj(args).items.empty()) {
          invalid("NEWOBJ is only accepted as OrderedDict.__new__(OrderedDict)");
        }
        uint32_t d = make(Kind::Dict);
        obj(d).ordered = true;
        obj(d).depth = 1;
        push(d);
        break;
      }
      case 'R':
        op_reduce();
        break;
      case 'b': {  // BUILD: only the attribute dict torch gives an OrderedDict (_metadata)
        uint32_t state = pop();
        const Object& inst = obj(top());
        if (inst.kind != Kind::Dict || !inst.ordered) {
          invalid("BUILD on a " + std::string(kind_name(inst.kind)) +
                  "; only an OrderedDict's attributes can be set");
        }
        if (obj(state).kind != Kind::Dict) {
          invalid("BUILD state is a " + std::string(kind_name(obj(state).kind)) +
                  ", expected a dict");
        }
        break;
      }
      case 'a': {  // APPEND
        uint32_t item = pop();
        append_items(top(), {item});
        break;
      }
      case 'e': {  // APPENDS
        std::vector<uint32_t> items = pop_mark();
        append_items(top(), items);
        break;
      }
      case 's': {  // SETITEM
        uint32_t value = pop();
        uint32_t key = pop();
        set_items(top(), {key, value});
        break;
      }
      case 'u': {  // SETITEMS
        std::vector<uint32_t> kv = pop_mark();
        set_items(top(), kv);
        break;
      }
      case '(':  // MARK
        if (marks_.size() >= limits_.max_marks) {
          over("too many open MARKs", limits_.max_marks);
        }
        marks_.push_back(stack_.size());
        break;
      case 't':
        push(make_container(Kind::Tuple, pop_mark()));
        break;
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        std::vector<uint32_t> items(op_ - 0x84);
        for (size_t i = items.size(); i-- > 0;) items[i] = pop();
        push(make_container(Kind::Tuple, std::move(items)));
        break;
      }
      case ')':  // EMPTY_TUPLE, EMPTY_LIST, EMPTY_DICT, EMPTY_SET
      case ']':
      case '}':
      case 0x8f: {
        Kind k = op_ == ')'   ? Kind::Tuple
                 : op_ == ']' ? Kind::List
                 : op_ == '}' ? Kind::Dict
                              : Kind::Set;
        push(make_container(k, {}));
        break;
      }
      case 'N':
        push(make(Kind::None));
        break;
      case 0x88:
      case 0x89: {
        uint32_t b = make(Kind::Bool);
        obj(b).number = op_ == 0x88 ? 1 : 0;
        push(b);
        break;
      }
      case 'J':
        push(make_int(static_cast<int32_t>(static_cast<uint32_t>(take_le(4)))));
        break;
      case 'K':  // BININT1, BININT2: unsigned
      case 'M':
        push(make_int(static_cast<int64_t>(take_le(op_ == 'K' ? 1 : 2))));
        break;
      case 0x8a: {  // LONG1: n-byte two's complement, little-endian
        auto n = static_cast<size_t>(take_le(1));
        if (n > 8)
          fail(ErrorCode::PickleLimitExceeded,
               "LONG1 of " + std::to_string(n) + " bytes does not fit in 64 bits");
        uint64_t v = n == 0 ? 0 : take_le(n);
        if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);
        push(make_int(static_cast<int64_t>(v)));
        break;
      }
      case 'G': {  // BINFLOAT: big-endian double
        const std::byte* b = take(8);
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | std::to_integer<uint64_t>(b[i]);
        uint32_t f = make(Kind::Float);
        std::memcpy(&obj(f).real, &bits, 8);
        push(f);
        break;
      }
      case 'X':
      case 'U': {  // BINUNICODE, SHORT_BINSTRING
        uint64_t n = take_le(op_ == 'X' ? 4 : 1);
        std::string s = take_string(n);
        uint32_t ref = make(Kind::String);
        obj(ref).text = std::move(s);
        push(ref);
        break;
      }
      case 'Q':
        op_persid();
        break;
      case 'h':
      case 'j': {  // BINGET, LONG_BINGET
        auto key = static_cast<uint32_t>(take_le(op_ == 'h' ? 1 : 4));
        auto it = memo_.find(key);
        if (it == memo_.end())
          invalid(op() + " of memo key " + std::to_string(key) + " that was never set");
        push(it->second);
        break;
      }
      case 'q':
      case 'r': {  // BINPUT, LONG_BINPUT
        auto key = static_cast<uint32_t>(take_le(op_ == 'q' ? 1 : 4));
        uint32_t value = top();
        if (memo_.size() >= limits_.max_memo && memo_.count(key) == 0) {
          over("too many memo entries", limits_.max_memo);
        }
        memo_[key] = value;
        break;
      }
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op_);
        fail(ErrorCode::ForbiddenOpcode, "forbidden opcode " + op() + " (" + hex + ")");
      }
    }
  }
}

}  // namespace

PickledStateDict run_pickle(std::span<const std::byte> pickle, const PickleLimits& limits) {
  return Machine(pickle, limits).run();
}

bool is_contiguous(const Shape& shape, const std::vector<int64_t>& stride) {
  int64_t expected = 1;
  for (int64_t d : shape) {
    if (d == 0) return true;
  }
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && stride[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

}  // namespace grouplin::pickle
