// Hand-made pickles for the .pt tests: a few protocol-2 opcodes spelled out, and the pickle
// PyTorch writes for a state dict of tensors.
//
//   state_dict({{"fc1.weight", tensor({.numel = 8, .size = {4}, .stride = {1}})}})
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace grouplin::test_pickle {

// v as n little-endian bytes.
inline std::string le(uint64_t v, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}
// BINUNICODE s.
inline std::string U(std::string_view s) {
  std::string out = "X";  // appends: GCC 12 warns (-Wrestrict) falsely on "X" + std::string
  out += le(s.size(), 4);
  out += s;
  return out;
}
// GLOBAL module.name.
inline std::string G(std::string_view module, std::string_view name) {
  std::string out = "c";  // appends: GCC 12 warns (-Wrestrict) falsely on "c" + std::string
  out += module;
  out += '\n';
  out += name;
  out += '\n';
  return out;
}
// The smallest integer opcode for v.
inline std::string I(int64_t v) {
  // Appends: GCC 12 warns (-Wrestrict) falsely on "K" + std::string.
  std::string out;
  if (v >= 0 && v < 256) {
    out = "K";
    out += le(static_cast<uint64_t>(v), 1);
  } else if (v >= 0 && v < 65536) {
    out = "M";
    out += le(static_cast<uint64_t>(v), 2);
  } else {
    out = "\x8a\x08";
    out += le(static_cast<uint64_t>(v), 8);
  }
  return out;
}
// A tuple of integers.
inline std::string T(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (int64_t x : v) s += I(x);
  return s + "t";
}
inline const std::string kOrderedDict = G("collections", "OrderedDict") + ")R";

// One tensor as torch.save pickles it: a persistent-id storage, offset, size, stride.
struct TensorSpec {
  std::string storage_type = "FloatStorage";
  std::string key = "0";
  int64_t numel = 6;
  int64_t offset = 0;
  std::vector<int64_t> size{2, 3};
  std::vector<int64_t> stride{3, 1};
  std::string fn = "_rebuild_tensor_v2";
  std::string extra;  // appended arguments (v3 dtype, metadata)
};

inline std::string tensor(const TensorSpec& t) {
  return G("torch._utils", t.fn) + "((" + U("storage") + G("torch", t.storage_type) + U(t.key) +
         U("cpu") + I(t.numel) + "tQ" + I(t.offset) + T(t.size) + T(t.stride) + "\x89" +
         kOrderedDict + t.extra + "tR";
}

// A whole data.pkl: an OrderedDict of (key, pickled value) in order.
// An OrderedDict of `entries` as a value inside a pickle.
inline std::string state_dict_body(
    const std::vector<std::pair<std::string, std::string>>& entries) {
  std::string s = kOrderedDict + "(";
  for (const auto& [k, v] : entries) s += U(k) + v;
  return s + "u";
}

inline std::string state_dict(const std::vector<std::pair<std::string, std::string>>& entries) {
  return "\x80\x02" + state_dict_body(entries) + ".";
}

}  // namespace grouplin::test_pickle
