// Private: the key patterns of layout rules, "{prefix}A{expert}B" for per-expert entries and
// "{prefix}C" for stacked ones, compiled once and matched against every key of a checkpoint.
//
//   KeyPattern p = *KeyPattern::compile("{prefix}{expert}.gate_proj.weight", true, error);
//   p.match("model.layers.0.mlp.experts.3.gate_proj.weight");  // prefix "model...experts.", 3
//   p.format("m.experts.", 7);                                  // "m.experts.7.gate_proj.weight"
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace grouplin::layout {

class KeyPattern {
 public:
  struct Match {
    std::string_view prefix;  // "" or ending in '.'
    int64_t expert = -1;      // -1 for a pattern without {expert}
  };

  // Compiles `pattern`: "{prefix}" first, then literal text with exactly one "{expert}" when
  // `per_expert` (none otherwise); the literal text may not be empty for a stacked pattern and
  // holds no other braces. Returns nullopt and sets `error` to what is wrong.
  static std::optional<KeyPattern> compile(std::string_view pattern, bool per_expert,
                                           std::string& error);

  // The prefix (and expert index) that make `key`, if any. The prefix must be empty or end in
  // '.'; the index follows the one expert-name rule (expert_names.hpp).
  std::optional<Match> match(std::string_view key) const;
  // The key for `prefix` (and `expert`).
  std::string format(std::string_view prefix, int64_t expert = -1) const;
  const std::string& text() const { return text_; }

 private:
  std::string text_;  // the pattern as written
  std::string head_;  // literal text between {prefix} and {expert} (or to the end)
  std::string tail_;  // literal text after {expert}
  bool per_expert_ = false;
};

}  // namespace grouplin::layout
