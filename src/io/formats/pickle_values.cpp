// The value arena, stack and memo of the pickle machine (see io/pickle_values.hpp).
#include "io/formats/pickle_values.hpp"

#include <algorithm>
#include <cstdint>
#include <functional>

namespace grouplin::pickle {
namespace {

constexpr const char* kKindNames[] = {"None",
                                      "bool",
                                      "int",
                                      "float",
                                      "str",
                                      "tuple",
                                      "list",
                                      "dict",
                                      "set",
                                      "global",
                                      "storage",
                                      "tensor",
                                      "transformer_engine DType",
                                      "transformer_engine quantizer",
                                      "bytes",
                                      "object"};

// What one entry of a node-based hash container costs: a node of two 4-byte fields, the next
// pointer and the cached hash (a 32-byte block from glibc's allocator), and its bucket pointer.
constexpr size_t kHashEntryBytes = 40;

constexpr Ref kNoRef = UINT32_MAX;

// base + per_byte x size, saturating: it cannot wrap on any pickle that fits in memory with the
// default limits, but the limits are the caller's to set.
size_t scaled_budget(size_t base, size_t per_byte, size_t size) {
  if (per_byte != 0 && size > (SIZE_MAX - base) / per_byte) return SIZE_MAX;
  return base + per_byte * size;
}

}  // namespace

const char* kind_name(Kind k) { return kKindNames[static_cast<size_t>(k)]; }

Values::Values(std::span<const std::byte> pickle, const PickleLimits& limits, const Cursor& cursor)
    : pickle_(pickle),
      limits_(limits),
      cursor_(cursor),
      dict_keys_(0, KeyHash{this}, KeyEqual{this}) {
  budget_ = scaled_budget(limits.memory_base, limits.memory_per_byte, pickle.size());
  work_budget_ = scaled_budget(limits.work_base, limits.work_per_byte, pickle.size());
}

void Values::charge(size_t bytes, const char* what) {
  if (bytes > budget_ - std::min(used_, budget_)) {
    cursor_.over(std::string("memory for ") + what + " past " + std::to_string(budget_) +
                     " bytes (memory_base + memory_per_byte x " + std::to_string(pickle_.size()) +
                     " bytes of pickle)",
                 budget_);
  }
  used_ += bytes;
}

void Values::spend(size_t steps, const char* what) {
  if (steps > work_budget_ - std::min(work_done_, work_budget_)) {
    cursor_.over(std::string("work on ") + what + " past " + std::to_string(work_budget_) +
                     " steps (work_base + work_per_byte x " + std::to_string(pickle_.size()) +
                     " bytes of pickle)",
                 work_budget_);
  }
  work_done_ += steps;
}

Ref Values::make(Kind kind) {
  if (values_.size() >= limits_.max_objects) cursor_.over("too many values", limits_.max_objects);
  grow(values_, "values");
  values_.emplace_back();
  values_.back().kind = kind;
  return static_cast<Ref>(values_.size() - 1);
}

Ref Values::make_int(int64_t v) {
  Ref r = make(Kind::Int);
  get(r).number = v;
  return r;
}

Ref Values::make_string(size_t offset, size_t size) {
  Ref r = make(Kind::String);
  get(r).number = static_cast<int64_t>(offset);
  get(r).aux = static_cast<uint32_t>(size);
  return r;
}

std::string_view Values::text(Ref r) const {
  const Value& v = values_[r];
  return {reinterpret_cast<const char*>(pickle_.data()) + v.number, v.aux};
}

void Values::check_depth(uint32_t depth) const {
  // Value::depth has 16 bits: larger limits act as 65535.
  const size_t limit = std::min<size_t>(limits_.max_depth, UINT16_MAX);
  if (depth > limit) cursor_.over("containers nested too deep", limit);
}

Ref Values::make_container(Kind kind, std::vector<Ref> items) {
  spend(items.size(), "container items");
  uint32_t depth = 1;
  for (Ref r : items) depth = std::max<uint32_t>(depth, get(r).depth + 1u);
  check_depth(depth);
  charge(items.capacity() * sizeof(Ref), "containers");
  grow(lists_, "containers");
  Ref ref = make(kind);
  get(ref).depth = static_cast<uint16_t>(depth);
  get(ref).aux = static_cast<uint32_t>(lists_.size());
  lists_.push_back(std::move(items));
  return ref;
}

void Values::add_child(Ref container, Ref child) {
  const uint32_t depth = std::max<uint32_t>(get(container).depth, get(child).depth + 1u);
  check_depth(depth);
  std::vector<Ref>& items = lists_[get(container).aux];
  grow(items, "container items");
  get(container).depth = static_cast<uint16_t>(depth);
  items.push_back(child);
}

void Values::append(Ref list, std::span<const Ref> items) {
  if (get(list).kind != Kind::List) {
    cursor_.invalid(cursor_.op_name() + " on a " + kind_name(get(list).kind) +
                    "; only lists can be appended to");
  }
  spend(items.size(), "container items");
  for (Ref r : items) add_child(list, r);
}

size_t Values::KeyHash::operator()(const KeySlot& k) const {
  const Value& key = v->get(k.second);
  // A string key's hash was cached by set_items before the key reached the set.
  const size_t content = key.kind == Kind::String
                             ? v->key_hashes_.at(k.second)
                             : std::hash<int64_t>()(key.number) ^ 0x9e3779b97f4a7c15ull;
  return content ^ (std::hash<Ref>()(k.first) * 0x100000001b3ull);
}

bool Values::KeyEqual::operator()(const KeySlot& a, const KeySlot& b) const {
  if (a.first != b.first) return false;
  const Value& x = v->get(a.second);
  const Value& y = v->get(b.second);
  const bool xs = x.kind == Kind::String, ys = y.kind == Kind::String;
  if (xs != ys) return false;
  return xs ? v->text(a.second) == v->text(b.second) : x.number == y.number;
}

void Values::set_items(Ref dict, std::span<const Ref> kv) {
  if (get(dict).kind != Kind::Dict) {
    cursor_.invalid(cursor_.op_name() + " on a " + kind_name(get(dict).kind) +
                    "; only dicts take items");
  }
  if (kv.size() % 2 != 0) cursor_.invalid(cursor_.op_name() + " with an odd number of values");
  spend(kv.size(), "dict items");
  for (size_t i = 0; i < kv.size(); i += 2) {
    const Value& k = get(kv[i]);
    if (k.kind != Kind::String && k.kind != Kind::Int && k.kind != Kind::Bool) {
      cursor_.invalid(cursor_.op_name() + " with a " + kind_name(k.kind) +
                      " key; only str and int keys are accepted");
    }
    charge(kHashEntryBytes, "dict keys");
    if (k.kind == Kind::String && key_hashes_.count(kv[i]) == 0) {
      spend(k.aux / 8, "dict key hashes");
      charge(kHashEntryBytes, "dict key hashes");
      key_hashes_.emplace(kv[i], std::hash<std::string_view>()(text(kv[i])));
    }
    if (!dict_keys_.insert({dict, kv[i]}).second) {
      const std::string shown =
          k.kind == Kind::String ? std::string(text(kv[i])) : std::to_string(k.number);
      cursor_.fail(ErrorCode::DuplicateName,
                   cursor_.op_name() + " sets key " + quote(shown) + " twice");
    }
    add_child(dict, kv[i]);
    add_child(dict, kv[i + 1]);
  }
}

void Values::push(Ref r) {
  if (stack_.size() >= limits_.max_stack) cursor_.over("stack too deep", limits_.max_stack);
  stack_.push_back(r);
}

Ref Values::pop() {
  const size_t floor = marks_.empty() ? 0 : marks_.back();
  if (stack_.size() <= floor) {
    cursor_.fail(ErrorCode::PickleStackError, cursor_.op_name() + " on an empty stack");
  }
  Ref r = stack_.back();
  stack_.pop_back();
  return r;
}

Ref Values::top() const {
  const size_t floor = marks_.empty() ? 0 : marks_.back();
  if (stack_.size() <= floor) {
    cursor_.fail(ErrorCode::PickleStackError, cursor_.op_name() + " on an empty stack");
  }
  return stack_.back();
}

void Values::mark() {
  if (marks_.size() >= limits_.max_marks) cursor_.over("too many open MARKs", limits_.max_marks);
  marks_.push_back(stack_.size());
}

std::vector<Ref> Values::pop_mark() {
  if (marks_.empty()) {
    cursor_.fail(ErrorCode::PickleStackError, cursor_.op_name() + " without a MARK");
  }
  spend(stack_.size() - marks_.back(), "values above a MARK");
  std::vector<Ref> items(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()), stack_.end());
  stack_.resize(marks_.back());
  marks_.pop_back();
  return items;
}

void Values::memo_put(uint32_t key, Ref r) {
  if (key < memo_dense_.size() && memo_dense_[key] != kNoRef) {
    memo_dense_[key] = r;
    return;
  }
  if (auto it = memo_sparse_.find(key); it != memo_sparse_.end()) {
    it->second = r;
    return;
  }
  if (memo_count_ >= limits_.max_memo) cursor_.over("too many memo entries", limits_.max_memo);
  // Keys that extend the dense run keep the vector at most twice the entries plus a page.
  if (key < 2 * memo_count_ + 1024) {
    while (memo_dense_.size() <= key) {
      grow(memo_dense_, "memo entries");
      memo_dense_.push_back(kNoRef);
    }
    memo_dense_[key] = r;
  } else {
    charge(kHashEntryBytes, "memo entries");
    memo_sparse_.emplace(key, r);
  }
  ++memo_count_;
}

Ref Values::memo_get(uint32_t key) const {
  if (key < memo_dense_.size() && memo_dense_[key] != kNoRef) return memo_dense_[key];
  auto it = memo_sparse_.find(key);
  if (it == memo_sparse_.end()) {
    cursor_.invalid(cursor_.op_name() + " of memo key " + std::to_string(key) +
                    " that was never set");
  }
  return it->second;
}

}  // namespace grouplin::pickle
