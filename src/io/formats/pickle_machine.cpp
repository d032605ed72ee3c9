// The restricted pickle machine's run loop (see io/pickle_machine.hpp): reads each opcode and its
// arguments, and hands values to the value store (io/pickle_values.hpp) and the torch
// reconstructors (io/pickle_torch.hpp).
#include "io/formats/pickle_machine.hpp"

#include <cstdio>
#include <cstring>

#include "core/utf8.hpp"
#include "grouplin/error.hpp"
#include "io/formats/pickle_opcodes.hpp"
#include "io/formats/pickle_torch.hpp"
#include "io/formats/pickle_values.hpp"

namespace grouplin::pickle {
namespace {

class Machine {
 public:
  Machine(std::span<const std::byte> pickle, const PickleLimits& limits, std::string_view key)
      : key_(key),
        p_(pickle),
        limits_(limits),
        values_(pickle, limits, cursor_),
        torch_(values_, cursor_, limits) {}

  PickledStateDict run();

 private:
  // Reading arguments.
  const std::byte* take(size_t n) {
    if (n > p_.size() - pos_) {
      cursor_.fail(ErrorCode::Truncated, cursor_.op_name() + " needs " + std::to_string(n) +
                                             " bytes, " + std::to_string(p_.size() - pos_) +
                                             " left");
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
  std::string_view take_line() {
    size_t end = pos_;
    while (end < p_.size() && p_[end] != std::byte{'\n'}) {
      if (end - pos_ >= limits_.max_string)
        cursor_.over("GLOBAL line too long", limits_.max_string);
      ++end;
    }
    if (end == p_.size()) cursor_.fail(ErrorCode::Truncated, "GLOBAL line has no end");
    std::string_view s(reinterpret_cast<const char*>(p_.data() + pos_), end - pos_);
    pos_ = end + 1;
    return s;
  }
  // A BINUNICODE or SHORT_BINSTRING argument of `n` bytes, as a str value viewing the pickle.
  Ref take_string(uint64_t n) {
    if (n > limits_.max_string) {
      cursor_.over(cursor_.op_name() + " string of " + std::to_string(n) + " bytes",
                   limits_.max_string);
    }
    const size_t offset = pos_;
    const std::byte* p = take(static_cast<size_t>(n));
    std::string_view s(reinterpret_cast<const char*>(p), static_cast<size_t>(n));
    if (!utf8::is_valid(s, /*allow_surrogates=*/true)) {
      cursor_.invalid(cursor_.op_name() + " string is not UTF-8: " + quote(s));
    }
    return values_.make_string(offset, s.size());
  }

  void step();

  std::string_view key_;
  std::span<const std::byte> p_;
  PickleLimits limits_;
  size_t pos_ = 0;
  Cursor cursor_;
  Values values_;
  TorchBuilder torch_;
  bool stopped_ = false;
  Ref result_ = 0;
};

PickledStateDict Machine::run() {
  if (p_.size() > limits_.max_bytes) {
    cursor_.over("pickle of " + std::to_string(p_.size()) + " bytes", limits_.max_bytes);
  }
  while (!stopped_) {
    cursor_.at = pos_;
    if (pos_ >= p_.size()) cursor_.fail(ErrorCode::Truncated, "the pickle ends without STOP");
    cursor_.op = std::to_integer<uint8_t>(p_[pos_++]);
    values_.spend(1, "opcodes");
    step();
  }
  return torch_.finish(result_, key_);
}

// Runs the opcode at cursor_; its arguments follow at pos_.
void Machine::step() {
  const uint8_t op = cursor_.op;
  switch (op) {
    case kProto: {
      uint64_t proto = take_le(1);
      if (proto > 5) cursor_.invalid("unknown pickle protocol " + std::to_string(proto));
      return;
    }
    case kStop: {
      result_ = values_.pop();
      if (values_.stack_size() != 0 || values_.open_marks() != 0) {
        cursor_.fail(ErrorCode::PickleStackError,
                     "STOP leaves " + std::to_string(values_.stack_size()) + " values and " +
                         std::to_string(values_.open_marks()) + " MARKs behind");
      }
      if (pos_ != p_.size())
        cursor_.invalid(std::to_string(p_.size() - pos_) + " bytes after STOP");
      stopped_ = true;
      return;
    }
    case kGlobal: {
      std::string_view module = take_line();
      std::string_view name = take_line();
      values_.push(torch_.global(module, name));
      return;
    }
    case kNewObj: {
      Ref args = values_.pop();
      Ref cls = values_.pop();
      values_.push(torch_.new_object(cls, args));
      return;
    }
    case kReduce: {
      Ref args = values_.pop();
      Ref fn = values_.top();
      values_.replace_top(torch_.reduce(fn, args));
      return;
    }
    case kBuild: {
      Ref state = values_.pop();
      torch_.build(values_.top(), state);
      return;
    }
    case kBinPersId:
      values_.push(torch_.persistent_id(values_.pop()));
      return;
    case kAppend: {
      Ref item = values_.pop();
      values_.append(values_.top(), std::span<const Ref>(&item, 1));
      return;
    }
    case kAppends: {
      std::vector<Ref> items = values_.pop_mark();
      values_.append(values_.top(), items);
      return;
    }
    case kSetItem: {
      Ref kv[2];
      kv[1] = values_.pop();
      kv[0] = values_.pop();
      values_.set_items(values_.top(), kv);
      return;
    }
    case kSetItems: {
      std::vector<Ref> kv = values_.pop_mark();
      values_.set_items(values_.top(), kv);
      return;
    }
    case kMark:
      values_.mark();
      return;
    case kTuple:
      values_.push(values_.make_container(Kind::Tuple, values_.pop_mark()));
      return;
    case kTuple1:
    case kTuple2:
    case kTuple3: {
      std::vector<Ref> items(op - kTuple1 + 1);
      for (size_t i = items.size(); i-- > 0;) items[i] = values_.pop();
      values_.push(values_.make_container(Kind::Tuple, std::move(items)));
      return;
    }
    case kEmptyTuple:
      values_.push(values_.make_container(Kind::Tuple, {}));
      return;
    case kEmptyList:
      values_.push(values_.make_container(Kind::List, {}));
      return;
    case kEmptyDict:
      values_.push(values_.make_container(Kind::Dict, {}));
      return;
    case kEmptySet:
      values_.push(values_.make_container(Kind::Set, {}));
      return;
    case kNone:
      values_.push(values_.make(Kind::None));
      return;
    case kNewTrue:
    case kNewFalse: {
      Ref b = values_.make(Kind::Bool);
      values_.get(b).number = op == kNewTrue ? 1 : 0;
      values_.push(b);
      return;
    }
    case kBinInt:
      values_.push(values_.make_int(static_cast<int32_t>(static_cast<uint32_t>(take_le(4)))));
      return;
    case kBinInt1:  // unsigned
    case kBinInt2:
      values_.push(values_.make_int(static_cast<int64_t>(take_le(op == kBinInt1 ? 1 : 2))));
      return;
    case kLong1: {  // n-byte two's complement, little-endian
      auto n = static_cast<size_t>(take_le(1));
      if (n > 8) {
        cursor_.fail(ErrorCode::PickleLimitExceeded,
                     "LONG1 of " + std::to_string(n) + " bytes does not fit in 64 bits");
      }
      uint64_t v = n == 0 ? 0 : take_le(n);
      if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);
      values_.push(values_.make_int(static_cast<int64_t>(v)));
      return;
    }
    case kBinFloat: {  // big-endian double
      const std::byte* b = take(8);
      uint64_t bits = 0;
      for (int i = 0; i < 8; ++i) bits = (bits << 8) | std::to_integer<uint64_t>(b[i]);
      Ref f = values_.make(Kind::Float);
      values_.get(f).number = static_cast<int64_t>(bits);
      values_.push(f);
      return;
    }
    case kBinUnicode:
    case kShortBinString:
      values_.push(take_string(take_le(op == kBinUnicode ? 4 : 1)));
      return;
    case kBinGet:
    case kLongBinGet:
      values_.push(values_.memo_get(static_cast<uint32_t>(take_le(op == kBinGet ? 1 : 4))));
      return;
    case kBinPut:
    case kLongBinPut: {
      auto key = static_cast<uint32_t>(take_le(op == kBinPut ? 1 : 4));
      values_.memo_put(key, values_.top());
      return;
    }
    default: {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", op);
      cursor_.fail(ErrorCode::ForbiddenOpcode,
                   "forbidden opcode " + cursor_.op_name() + " (" + hex + ")");
    }
  }
}

}  // namespace

PickledStateDict run_pickle(std::span<const std::byte> pickle, const PickleLimits& limits,
                            std::string_view state_dict_key) {
  return Machine(pickle, limits, state_dict_key).run();
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
