#include "layout/expert_names.hpp"

namespace grouplin::layout {

std::optional<int64_t> expert_index(std::string_view leaf, std::string_view base) {
  if (leaf.size() <= base.size() || leaf.substr(0, base.size()) != base) return std::nullopt;
  const std::string_view digits = leaf.substr(base.size());
  if (digits.size() > kMaxIndexDigits || (digits.size() > 1 && digits[0] == '0')) {
    return std::nullopt;
  }
  int64_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

std::string expert_key(std::string_view prefix, std::string_view base, int64_t index) {
  std::string key(prefix);
  key += base;
  key += std::to_string(index);
  return key;
}

SplitKey split_key(std::string_view key) {
  const size_t dot = key.rfind('.');
  const size_t leaf_at = dot == std::string_view::npos ? 0 : dot + 1;
  return {key.substr(0, leaf_at), key.substr(leaf_at)};
}

}  // namespace grouplin::layout
