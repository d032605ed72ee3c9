#include "layout/renames.hpp"

namespace grouplin::layout {
namespace {

// Replaces each occurrence of `from` in `s` by `to`, but not one that lies inside an occurrence
// of `to` (where `to` holds `from` at offset `inner`).
void replace_all(std::string& s, const std::string& from, const std::string& to) {
  const size_t inner = to.find(from);
  for (size_t at = s.find(from); at != std::string::npos;) {
    const bool inside_to =
        inner != std::string::npos && at >= inner && s.compare(at - inner, to.size(), to) == 0;
    if (inside_to) {
      at = s.find(from, at - inner + to.size());
      continue;
    }
    s.replace(at, from.size(), to);
    at = s.find(from, at + to.size());
  }
}

// The same for a rename anchored at the key's start ("^head.weight" -> "lm_head.weight"):
// `from` (without its '^') replaced once, at position 0 only.
void replace_start(std::string& s, const std::string& from, const std::string& to) {
  if (!s.starts_with(from)) return;
  if (to.starts_with(from) && s.starts_with(to)) return;  // already in the target spelling
  s.replace(0, from.size(), to);
}

}  // namespace

std::string renamed(std::string_view key, const LayoutRules& rules, bool to_single) {
  const std::string& scope = rules.renames_after;
  std::string out(key);
  const auto& r = rules.renames;
  for (size_t k = 0; k < r.size(); ++k) {
    const auto& [per_expert, single] = to_single ? r[k] : r[r.size() - 1 - k];
    const bool anchored = per_expert.starts_with('^');
    const std::string plain = anchored ? per_expert.substr(1) : per_expert;
    const std::string& from = to_single ? plain : single;
    const std::string& to = to_single ? single : plain;
    if (anchored) {
      replace_start(out, from, to);
    } else if (!scope.empty() && out.starts_with(scope) && !from.starts_with(scope)) {
      // Below the base model: "model.norm.weight" holds no ".norm.".
      std::string rest = out.substr(scope.size());
      replace_all(rest, from, to);
      out = scope + rest;
    } else {
      replace_all(out, from, to);
    }
  }
  return out;
}

}  // namespace grouplin::layout
