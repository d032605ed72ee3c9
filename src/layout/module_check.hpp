// Private: one candidate module of a scan (the entries one rule set claims under one prefix) and
// the checks that make it a grouped module or a problem (see checkpoint_layout.hpp for the
// problem codes). module_scan.cpp gathers the candidates.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "grouplin/error.hpp"
#include "grouplin/state_dict.hpp"
#include "layout/compiled_rules.hpp"

namespace grouplin::layout {

using Entry = StateDict::Entry;

// What a candidate holds of one stacked tensor of its rule set.
struct CandidateTensor {
  std::vector<size_t> entries;  // dict positions of its entries, in dict order
  const Entry* stacked = nullptr;
  bool unit_dim = false;
  std::vector<std::map<int64_t, const Entry*>> parts;  // per part: expert -> entry

  bool per_expert() const;
  const Entry* first_per_expert() const;
};

struct Candidate {
  size_t set = 0;
  std::string canonical;  // the prefix in the single layout (after renames)
  std::string spelled;    // the per-expert prefix as first met ("" until one is met)
  size_t first_entry = 0;
  bool spoiled = false;  // a stacked tensor of the wrong rank shares the prefix
  std::vector<size_t> entries;
  std::vector<CandidateTensor> tensors;
};

// One stacked tensor of a module as the dict holds it.
struct FoundTensor {
  bool present = false;
  const Entry* stacked = nullptr;  // single layout
  bool unit_dim = false;           // stacked as [N, 1, ...]
  // Per-expert layout: for each part, expert index -> entry.
  std::vector<std::map<int64_t, const Entry*>> parts;
  Shape part_shape;                // one part of one expert, per-expert orientation (all parts
                                   // equal but for the first dim)
  std::vector<int64_t> part_rows;  // each part's first dim
  int64_t folded_rows = 0;         // folded stacked tensors: stored rows per expert
  // FP8 scales (StackedTensorRule::scale_of): the block shape found ([] per tensor), and whether
  // every part of the weight but the last ends on a block boundary, so that the scales of the
  // parts can be concatenated or split (else part_rows is {all rows, 0, ...}).
  std::vector<int64_t> block;
  bool blocks_aligned = true;
};

struct FoundModule {
  size_t rules = 0;                  // index of its rule set
  std::string canonical;             // its prefix in the single layout (after renames)
  std::string spelled;               // its per-expert prefix (renames reversed)
  std::vector<FoundTensor> tensors;  // in the rule set's order
  size_t first_entry = 0;            // dict position of its first entry
  int64_t num_experts = 0;
};

// "grouped module \"P\"" (or "at the root") for messages.
std::string module_name(const std::string& prefix);

// Checks candidate `c` of `rules`: returns the module, or sets `problem` and returns nullopt.
// `folded_experts` is the expert count of the set's experts_from entry, when it has one.
std::optional<FoundModule> check_candidate(const Candidate& c, size_t set,
                                           const CompiledRules& rules,
                                           std::optional<int64_t> folded_experts,
                                           std::optional<Error>& problem);

// "\"P.weight3\", \"P.weight7\"": the keys of the indices in [0, n) that `present` lacks, under
// `prefix` (at most 8, then a count).
std::string missing_list(const std::map<int64_t, const Entry*>& present, int64_t n,
                         const KeyPattern& pattern, const std::string& prefix);

}  // namespace grouplin::layout
