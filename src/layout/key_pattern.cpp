#include "layout/key_pattern.hpp"

#include "layout/expert_names.hpp"

namespace grouplin::layout {

namespace {
constexpr std::string_view kPrefix = "{prefix}";
constexpr std::string_view kExpert = "{expert}";
}  // namespace

std::optional<KeyPattern> KeyPattern::compile(std::string_view pattern, bool per_expert,
                                              std::string& error) {
  if (!pattern.starts_with(kPrefix)) {
    error = "does not start with {prefix}";
    return std::nullopt;
  }
  std::string_view rest = pattern.substr(kPrefix.size());
  KeyPattern p;
  p.text_ = std::string(pattern);
  p.per_expert_ = per_expert;
  const size_t at = rest.find(kExpert);
  if (per_expert) {
    if (at == std::string_view::npos) {
      error = "has no {expert}";
      return std::nullopt;
    }
    p.head_ = std::string(rest.substr(0, at));
    p.tail_ = std::string(rest.substr(at + kExpert.size()));
  } else {
    if (at != std::string_view::npos) {
      error = "has {expert}, which a stacked name cannot have";
      return std::nullopt;
    }
    if (rest.empty()) {
      error = "names nothing after {prefix}";
      return std::nullopt;
    }
    p.head_ = std::string(rest);
  }
  for (const std::string* part : {&p.head_, &p.tail_}) {
    if (part->find_first_of("{}") != std::string::npos) {
      error = "has a brace other than one {prefix} and one {expert}";
      return std::nullopt;
    }
  }
  return p;
}

std::optional<KeyPattern::Match> KeyPattern::match(std::string_view key) const {
  if (!key.ends_with(tail_)) return std::nullopt;
  const std::string_view mid = key.substr(0, key.size() - tail_.size());
  if (!per_expert_) {
    if (!mid.ends_with(head_)) return std::nullopt;
    const std::string_view prefix = mid.substr(0, mid.size() - head_.size());
    if (!prefix.empty() && prefix.back() != '.') return std::nullopt;
    return Match{prefix, -1};
  }
  // The index is the last 1..9 digits of `mid`; the literal text before it may end in digits too
  // ("{prefix}fc1{expert}": "m.fc112" is expert 12), so each split is tried, shortest index first.
  size_t digits = 0;
  while (digits < mid.size() && digits <= kMaxIndexDigits && mid[mid.size() - 1 - digits] >= '0' &&
         mid[mid.size() - 1 - digits] <= '9') {
    ++digits;
  }
  for (size_t d = 1; d <= digits && d <= kMaxIndexDigits; ++d) {
    const std::string_view before = mid.substr(0, mid.size() - d);
    if (!before.ends_with(head_)) continue;
    const std::string_view prefix = before.substr(0, before.size() - head_.size());
    if (!prefix.empty() && prefix.back() != '.') continue;
    std::string leaf = head_;  // the one expert-name rule: canonical index, at most 9 digits
    leaf += mid.substr(mid.size() - d);
    const std::optional<int64_t> index = expert_index(leaf, head_);
    if (!index) continue;
    return Match{prefix, *index};
  }
  return std::nullopt;
}

std::string KeyPattern::format(std::string_view prefix, int64_t expert) const {
  std::string key(prefix);
  key += head_;
  if (per_expert_) {
    key += std::to_string(expert);
    key += tail_;
  }
  return key;
}

}  // namespace grouplin::layout
