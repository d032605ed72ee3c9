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
  std::string_view mid = key.substr(0, key.size() - tail_.size());
  Match m;
  if (per_expert_) {
    size_t digits = 0;
    while (digits < mid.size() && mid[mid.size() - 1 - digits] >= '0' &&
           mid[mid.size() - 1 - digits] <= '9') {
      ++digits;
    }
    if (digits == 0) return std::nullopt;
    const std::string_view leaf_end = mid.substr(mid.size() - digits);
    mid = mid.substr(0, mid.size() - digits);
    if (!mid.ends_with(head_)) return std::nullopt;
    std::string leaf = head_;  // the one expert-name rule: canonical index, at most 9 digits
    leaf += leaf_end;
    const std::optional<int64_t> index = expert_index(leaf, head_);
    if (!index) return std::nullopt;
    m.expert = *index;
    mid = mid.substr(0, mid.size() - head_.size());
  } else {
    if (!mid.ends_with(head_)) return std::nullopt;
    mid = mid.substr(0, mid.size() - head_.size());
  }
  if (!mid.empty() && mid.back() != '.') return std::nullopt;
  m.prefix = mid;
  return m;
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
