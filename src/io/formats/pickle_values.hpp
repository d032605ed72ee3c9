// Private: the values a pickle builds, the stack and memo that hold them, and the memory budget
// that bounds them all (PickleLimits).
//
//   Cursor cursor;
//   Values v(pickle, limits, cursor);
//   v.push(v.make_int(7));
//   Ref list = v.make_container(Kind::List, {});
//   v.append(list, std::vector<Ref>{v.pop()});
//
// Values live in one arena and refer to each other by index (Ref), so reference cycles made
// through the memo cost nothing and leak nothing, and no code walks values recursively. A string
// is a view of the pickle itself: a key memoized once and used a million times is held once.
// Everything the machine holds is charged to one budget proportional to the pickle's size, so
// no pickle can make the machine hold much more than itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "io/formats/pickle_machine.hpp"
#include "io/formats/pickle_opcodes.hpp"

namespace grouplin::pickle {

// clang-format off
enum class Kind : uint8_t { None, Bool, Int, Float, String, Tuple, List, Dict, Set, Global, Storage, Tensor, TeDType, TeQuantizer, Bytes, Object };
// clang-format on

// "None", "int", "str", ... as Python names the type.
const char* kind_name(Kind k);

// A value's index in the arena.
using Ref = uint32_t;

struct Value {
  Kind kind = Kind::None;
  bool ordered = false;  // Dict: a collections.OrderedDict
  uint16_t depth = 0;    // containers nested inside (0 for scalars); max_depth is at most 65535
  // String: length in bytes; Tuple, List, Dict, Set: index of its item list.
  uint32_t aux = 0;
  // Bool, Int: the value; Float: the double's bits; String: offset in the pickle; Global: index
  // in the allow-list; Storage, Tensor: index in the tables of the torch reconstructors;
  // TeDType: TransformerEngine's dtype code (float8 e4m3 7 from TE 2.4, 6 before; -1 until a
  // pybind11 enum's BUILD gives it), aux 1 when it came by member name (TE >= 2.17's IntEnum as
  // Python >= 3.11 pickles it).
  int64_t number = 0;
};

class Values {
 public:
  // `pickle` and `cursor` must outlive the Values.
  Values(std::span<const std::byte> pickle, const PickleLimits& limits, const Cursor& cursor);

  // Counts `bytes` more of memory held; PickleLimitExceeded once the total passes
  // limits.memory_base + limits.memory_per_byte x the pickle's size. `what` names the holder.
  void charge(size_t bytes, const char* what);
  // Counts `steps` more of work (PickleLimits::work_base: an opcode, a value visited or copied, 8
  // bytes of a string checked, hashed or copied); PickleLimitExceeded once the total passes
  // limits.work_base + limits.work_per_byte x the pickle's size. `what` names the work.
  void spend(size_t steps, const char* what);
  // Makes room for one more element in `v`, charging what growing it allocates: the budget
  // counts vector capacities, not sizes.
  template <typename T>
  void grow(std::vector<T>& v, const char* what) {
    if (v.size() < v.capacity()) return;
    const size_t next = v.capacity() < 4 ? 4 : 2 * v.capacity();
    charge((next - v.capacity()) * sizeof(T), what);
    v.reserve(next);
  }

  // New values. PickleLimitExceeded past max_objects or max_depth.
  Ref make(Kind kind);
  Ref make_int(int64_t v);
  // A str whose UTF-8 bytes are pickle[offset, offset + size) (checked by the caller).
  Ref make_string(size_t offset, size_t size);
  Ref make_container(Kind kind, std::vector<Ref> items);

  const Value& get(Ref r) const { return values_[r]; }
  Value& get(Ref r) { return values_[r]; }
  // The text of a String value.
  std::string_view text(Ref r) const;
  // The items of a container: Tuple, List, Set; a Dict's are key, value, key, value, ...
  std::span<const Ref> items(Ref r) const { return lists_[values_[r].aux]; }

  // APPEND(S) onto `list`; InvalidPickle unless it is a list.
  void append(Ref list, std::span<const Ref> items);
  // SETITEM(S) on `dict`; InvalidPickle unless it is a dict and the keys are str or int,
  // DuplicateName for a key set twice (True and 1 are one key, as in Python).
  void set_items(Ref dict, std::span<const Ref> kv);

  // The stack, in MARK-delimited levels. PickleStackError past the innermost MARK.
  void push(Ref r);
  Ref pop();
  Ref top() const;
  void replace_top(Ref r) { stack_.back() = r; }  // Requires: top() succeeded
  void mark();
  std::vector<Ref> pop_mark();  // the values above the innermost MARK, which is removed
  size_t stack_size() const { return stack_.size(); }
  size_t open_marks() const { return marks_.size(); }

  // The memo. InvalidPickle for a key never set.
  void memo_put(uint32_t key, Ref r);
  Ref memo_get(uint32_t key) const;

 private:
  void check_depth(uint32_t depth) const;
  void add_child(Ref container, Ref child);

  // A dict key set on one dict: (dict, key value). Hashed and compared by the key's content.
  using KeySlot = std::pair<Ref, Ref>;
  struct KeyHash {
    const Values* v;
    size_t operator()(const KeySlot& k) const;
  };
  struct KeyEqual {
    const Values* v;
    bool operator()(const KeySlot& a, const KeySlot& b) const;
  };

  std::span<const std::byte> pickle_;
  const PickleLimits& limits_;
  const Cursor& cursor_;
  size_t budget_;
  size_t used_ = 0;
  size_t work_budget_;
  size_t work_done_ = 0;
  std::vector<Value> values_;
  std::vector<std::vector<Ref>> lists_;
  std::vector<Ref> stack_;
  std::vector<size_t> marks_;
  // Memo keys as torch writes them (0, 1, 2, ...) index a vector; the others, a map.
  std::vector<Ref> memo_dense_;  // kNoRef where unset
  std::unordered_map<uint32_t, Ref> memo_sparse_;
  size_t memo_count_ = 0;
  std::unordered_set<KeySlot, KeyHash, KeyEqual> dict_keys_;
  // The content hash of each string value used as a dict key, computed once: a memoized 64 KiB
  // key reused by thousands of dicts was hashed in full on every insert and rehash (7.4 s for a
  // 2 MiB pickle, 0.9 s with the cache).
  std::unordered_map<Ref, size_t> key_hashes_;
};

}  // namespace grouplin::pickle
