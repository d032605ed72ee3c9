// Finding grouped modules by layout rules (see include/grouplin/checkpoint_layout.hpp for the
// contract and the problems it reports).
#include "layout/module_scan.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "layout/key_pattern.hpp"

namespace grouplin::layout {
namespace {

// Missing indices quoted in one PartialExpertSet message.
constexpr size_t kMaxListed = 8;

using Entry = StateDict::Entry;

struct Compiled {
  std::vector<KeyPattern> stacked;             // per tensor
  std::vector<std::vector<KeyPattern>> parts;  // per tensor, per part
};

Compiled compile(const LayoutRules& r) {
  Compiled c;
  std::string error;  // parse_rules and builtin_rules have checked every pattern
  for (const StackedTensorRule& t : r.tensors) {
    c.stacked.push_back(*KeyPattern::compile(t.stacked, false, error));
    c.parts.emplace_back();
    for (const std::string& p : t.parts)
      c.parts.back().push_back(*KeyPattern::compile(p, true, error));
  }
  return c;
}

struct CandidateTensor {
  std::vector<size_t> entries;  // dict positions of its entries, in dict order
  const Entry* stacked = nullptr;
  bool unit_dim = false;
  std::vector<std::map<int64_t, const Entry*>> parts;
  bool per_expert() const {
    for (const auto& p : parts) {
      if (!p.empty()) return true;
    }
    return false;
  }
  const Entry* first_per_expert() const {
    for (const auto& p : parts) {
      if (!p.empty()) return p.begin()->second;
    }
    return nullptr;
  }
};

struct Candidate {
  size_t set = 0;
  std::string canonical;
  std::string spelled;  // the per-expert prefix as first met ("" until one is met)
  size_t first_entry = 0;
  bool spoiled = false;  // a stacked tensor of the wrong rank shares the prefix
  std::vector<size_t> entries;
  std::vector<CandidateTensor> tensors;
};

std::string module_name(const std::string& prefix) {
  return prefix.empty() ? std::string("grouped module at the root")
                        : "grouped module " + quote(prefix);
}

std::string dims_text(const std::vector<std::string>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + dims[i];
  return s + "]";
}

// "weight3, weight7" for the indices in [0, n) that `present` lacks (at most kMaxListed).
std::string missing_list(const std::map<int64_t, const Entry*>& present, int64_t n,
                         const KeyPattern& pattern) {
  std::string out;
  size_t listed = 0;
  for (int64_t i = 0; i < n && listed < kMaxListed; ++i) {
    if (present.count(i)) continue;
    out += (listed ? ", " : "") + pattern.format("", i);
    ++listed;
  }
  // Every index present is below n: a count, not a walk over up to a billion indices.
  const uint64_t missing = static_cast<uint64_t>(n) - present.size();
  if (missing > listed) out += " and " + std::to_string(missing - listed) + " more";
  return out;
}

// Checks one candidate; returns the module or sets `problem`.
class Checker {
 public:
  Checker(const Candidate& c, const LayoutRules& rules, const Compiled& compiled)
      : c_(c), rules_(rules), compiled_(compiled), what_(module_name(prefix_for_messages())) {}

  std::optional<FoundModule> check(std::optional<Error>& problem);

 private:
  std::string prefix_for_messages() const { return c_.spelled.empty() ? c_.canonical : c_.spelled; }
  std::optional<Error> fail(ErrorCode code, const std::string& message) const {
    return Error(code, what_ + ": " + message);
  }
  // One tensor's own checks; fills `out`.
  std::optional<Error> check_tensor(size_t t, FoundTensor& out, int64_t& n) const;
  // The named dims of `shape` (one part of one expert) against those already seen.
  std::optional<Error> check_dims(size_t t, const std::string& key, const Shape& part_shape,
                                  const Shape& full_shape, bool stacked, int64_t n);

  const Candidate& c_;
  const LayoutRules& rules_;
  const Compiled& compiled_;
  std::string what_;
  std::map<std::string, int64_t> dims_;
  std::map<std::string, std::string> dim_source_;
};

std::optional<Error> Checker::check_tensor(size_t t, FoundTensor& out, int64_t& n) const {
  const CandidateTensor& ct = c_.tensors[t];
  const StackedTensorRule& rule = rules_.tensors[t];
  const size_t nparts = rule.parts.size();
  if (ct.stacked != nullptr) {
    const Tensor& s = ct.stacked->second;
    n = s.dim(0);
    if (n == 0) {
      return fail(ErrorCode::ShapeMismatch, quote(ct.stacked->first) + " has shape " +
                                                shape_to_string(s.shape()) +
                                                ": no experts (a grouped module has at least one)");
    }
    Shape expert(s.shape().begin() + (ct.unit_dim ? 2 : 1), s.shape().end());
    if (expert[0] % static_cast<int64_t>(nparts) != 0) {
      return fail(ErrorCode::ShapeMismatch,
                  quote(ct.stacked->first) + " has shape " + shape_to_string(s.shape()) + ": " +
                      std::to_string(expert[0]) + " rows per expert do not split into " +
                      std::to_string(nparts) + " equal parts");
    }
    out.stacked = ct.stacked;
    out.unit_dim = ct.unit_dim;
    out.part_rows.assign(nparts, expert[0] / static_cast<int64_t>(nparts));
    out.part_shape = expert;
    out.part_shape[0] = out.part_rows[0];
    return std::nullopt;
  }
  // Per-expert: every part holds experts 0..n-1, all of one shape and dtype.
  n = 0;
  for (const auto& part : ct.parts) {
    if (!part.empty()) n = std::max(n, part.rbegin()->first + 1);
  }
  const Entry* first = ct.first_per_expert();
  for (size_t p = 0; p < nparts; ++p) {
    const auto& part = ct.parts[p];
    if (part.empty()) {
      return fail(ErrorCode::PartialExpertSet,
                  "has " + quote(first->first) + " but no " +
                      quote(compiled_.parts[t][p].format(prefix_for_messages(), 0)));
    }
    if (static_cast<int64_t>(part.size()) != n) {
      return fail(ErrorCode::PartialExpertSet,
                  "has " + std::to_string(part.size()) + " experts of " +
                      quote(compiled_.parts[t][p].format(prefix_for_messages(), 0)) + " up to " +
                      quote(part.rbegin()->second->first) + " but lacks " +
                      missing_list(part, n, compiled_.parts[t][p]));
    }
  }
  const Tensor& t0 = first->second;
  if (t0.rank() != rule.dims.size()) {
    return fail(ErrorCode::ShapeMismatch, quote(first->first) + " has shape " +
                                              shape_to_string(t0.shape()) + ", expected " +
                                              dims_text(rule.dims));
  }
  out.parts.assign(nparts, {});
  out.part_rows.clear();
  for (size_t p = 0; p < nparts; ++p) {
    const Entry* ref = ct.parts[p].begin()->second;
    for (const auto& [i, e] : ct.parts[p]) {
      const Shape& shape = e->second.shape();
      const bool same_rest = shape.size() == t0.rank() &&
                             std::equal(shape.begin() + 1, shape.end(), t0.shape().begin() + 1);
      if (!same_rest || shape != ref->second.shape()) {
        return fail(ErrorCode::ShapeMismatch,
                    quote(e->first) + " has shape " + shape_to_string(shape) + ", expected " +
                        shape_to_string(ref->second.shape()) + " as " + quote(ref->first));
      }
      if (e->second.dtype() != t0.dtype()) {
        return fail(ErrorCode::DTypeMismatch,
                    quote(e->first) + " is " + std::string(dtype_name(e->second.dtype())) +
                        ", expected " + std::string(dtype_name(t0.dtype())) + " as " +
                        quote(first->first));
      }
    }
    out.parts[p] = ct.parts[p];
    out.part_rows.push_back(ref->second.dim(0));
  }
  out.part_shape = t0.shape();
  return std::nullopt;
}

std::optional<Error> Checker::check_dims(size_t t, const std::string& key, const Shape& part_shape,
                                         const Shape& full_shape, bool stacked, int64_t n) {
  const std::vector<std::string>& dims = rules_.tensors[t].dims;
  Shape want = part_shape;
  bool ok = true;
  std::string because;
  for (size_t d = 0; d < dims.size(); ++d) {
    auto it = dims_.find(dims[d]);
    if (it == dims_.end()) continue;
    if (it->second != part_shape[d]) {
      ok = false;
      want[d] = it->second;
      because = dims[d] + " = " + std::to_string(it->second) + " from " + dim_source_[dims[d]];
    }
  }
  if (!ok) {
    Shape full = want;
    if (stacked) {
      full[0] = full_shape[full_shape.size() - part_shape.size()] / part_shape[0] * want[0];
      full.insert(full.begin(), n);
    }
    return fail(ErrorCode::ShapeMismatch, quote(key) + " has shape " + shape_to_string(full_shape) +
                                              ", expected " + shape_to_string(full) + " (" +
                                              because + ")");
  }
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims_.emplace(dims[d], part_shape[d]).second) dim_source_[dims[d]] = quote(key);
  }
  return std::nullopt;
}

std::optional<FoundModule> Checker::check(std::optional<Error>& problem) {
  FoundModule m;
  m.rules = c_.set;
  m.canonical = c_.canonical;
  m.spelled = renamed(c_.canonical, rules_, false);
  m.first_entry = c_.first_entry;
  m.tensors.resize(rules_.tensors.size());
  int64_t n_module = -1;
  for (size_t t = 0; t < rules_.tensors.size(); ++t) {
    const CandidateTensor& ct = c_.tensors[t];
    const bool stacked = ct.stacked != nullptr;
    if (!stacked && !ct.per_expert()) {
      if (!rules_.tensors[t].optional) {
        problem = fail(ErrorCode::PartialExpertSet,
                       "has " +
                           quote(c_.tensors[0].stacked ? c_.tensors[0].stacked->first
                                                       : c_.tensors[0].first_per_expert()->first) +
                           " but no " + quote(compiled_.stacked[t].format(c_.canonical)) +
                           " (single) nor " +
                           quote(compiled_.parts[t][0].format(prefix_for_messages(), 0)) +
                           " (per-expert), which the " + rules_.name + " rules require");
        return std::nullopt;
      }
      continue;
    }
    if (stacked && ct.per_expert()) {
      problem =
          fail(ErrorCode::BothLayoutsPresent, "has both " + quote(ct.stacked->first) + " and " +
                                                  quote(ct.first_per_expert()->first) +
                                                  " (single and per-expert layouts at once)");
      return std::nullopt;
    }
    FoundTensor& out = m.tensors[t];
    out.present = true;
    int64_t n = 0;
    if (auto e = check_tensor(t, out, n)) {
      problem = e;
      return std::nullopt;
    }
    if (n_module < 0) n_module = n;
    if (n != n_module) {
      if (stacked) {
        Shape want = ct.stacked->second.shape();
        want[0] = n_module;
        problem = fail(ErrorCode::ShapeMismatch, quote(ct.stacked->first) + " has shape " +
                                                     shape_to_string(ct.stacked->second.shape()) +
                                                     ", expected " + shape_to_string(want) + " (" +
                                                     std::to_string(n_module) + " experts)");
      } else if (n > n_module) {
        const auto& part = ct.parts[0].empty() ? ct.parts.back() : ct.parts[0];
        problem = fail(ErrorCode::PartialExpertSet, "has " + quote(part.rbegin()->second->first) +
                                                        " but only " + std::to_string(n_module) +
                                                        " experts");
      } else {
        problem = fail(ErrorCode::PartialExpertSet,
                       "has " + quote(compiled_.stacked[t].format(c_.canonical)) + " entries for " +
                           std::to_string(n) + " of its " + std::to_string(n_module) +
                           " experts; lacks " +
                           missing_list(ct.parts[0], n_module, compiled_.parts[t][0]));
      }
      return std::nullopt;
    }
    // Dims agree across the module's tensors, part by part.
    for (size_t p = 0; p < rules_.tensors[t].parts.size(); ++p) {
      Shape part_shape = out.part_shape;
      part_shape[0] = out.part_rows[p];
      const Entry* e = stacked ? ct.stacked : ct.parts[p].begin()->second;
      if (auto err = check_dims(t, e->first, part_shape, e->second.shape(), stacked, n_module)) {
        problem = err;
        return std::nullopt;
      }
    }
  }
  return m;
}

}  // namespace

std::string renamed(std::string_view key, const LayoutRules& rules, bool to_single) {
  std::string out(key);
  for (const auto& [per_expert, single] : rules.renames) {
    const std::string& from = to_single ? per_expert : single;
    const std::string& to = to_single ? single : per_expert;
    for (size_t at = out.find(from); at != std::string::npos; at = out.find(from, at + to.size())) {
      out.replace(at, from.size(), to);
    }
  }
  return out;
}

ModuleScan scan_modules(const StateDict& dict, const std::vector<LayoutRules>& rules,
                        bool explicit_rules) {
  std::vector<Compiled> compiled;
  for (const LayoutRules& r : rules) compiled.push_back(compile(r));
  std::vector<Candidate> candidates;
  std::map<std::pair<size_t, std::string>, size_t> by_key;
  auto candidate = [&](size_t set, const std::string& canonical, size_t pos) -> Candidate& {
    auto [it, added] = by_key.emplace(std::pair(set, canonical), candidates.size());
    if (added) {
      candidates.push_back({set, canonical, "", pos, false, {}, {}});
      candidates.back().tensors.resize(rules[set].tensors.size());
      for (size_t t = 0; t < rules[set].tensors.size(); ++t) {
        candidates.back().tensors[t].parts.resize(rules[set].tensors[t].parts.size());
      }
    }
    return candidates[it->second];
  };

  ModuleScan out;
  out.matched.assign(rules.size(), false);
  std::vector<std::pair<size_t, Error>> conflicts;  // (dict position, problem)
  size_t pos = 0;
  for (const Entry& e : dict) {
    struct Claim {
      size_t set, tensor;
      int part;  // -1: stacked
      int64_t expert;
      std::string canonical, prefix;
      bool unit_dim;
    };
    std::vector<Claim> claims;
    for (size_t s = 0; s < rules.size(); ++s) {
      for (size_t t = 0; t < rules[s].tensors.size(); ++t) {
        const StackedTensorRule& rule = rules[s].tensors[t];
        if (auto m = compiled[s].stacked[t].match(e.first)) {
          const Tensor& v = e.second;
          const size_t rank = rule.dims.size() + 1;
          const bool unit = rule.unit_dim && v.rank() == rank + 1 && v.dim(1) == 1;
          if (v.rank() == rank || unit) {
            claims.push_back({s, t, -1, -1, std::string(m->prefix), "", unit});
          } else if (t != 0) {
            candidate(s, std::string(m->prefix), pos).spoiled = true;
          }
        }
        for (size_t p = 0; p < rule.parts.size(); ++p) {
          if (auto m = compiled[s].parts[t][p].match(e.first)) {
            claims.push_back({s, t, static_cast<int>(p), m->expert,
                              renamed(m->prefix, rules[s], true), std::string(m->prefix), false});
          }
        }
      }
    }
    if (claims.size() > 1) {
      const bool same_set = std::all_of(claims.begin(), claims.end(),
                                        [&](const Claim& c) { return c.set == claims[0].set; });
      if (explicit_rules || same_set) {
        std::string who;
        for (const Claim& c : claims) {
          const StackedTensorRule& r = rules[c.set].tensors[c.tensor];
          who += (who.empty() ? "" : " and ") + quote(c.part < 0 ? r.stacked : r.parts[c.part]) +
                 " (" + rules[c.set].name + ")";
        }
        conflicts.emplace_back(pos, Error(ErrorCode::RuleConflict,
                                          "entry " + quote(e.first) + " is claimed by " + who));
        ++pos;
        continue;
      }
      claims.resize(1);  // detected sets: the first set wins
    }
    for (const Claim& c : claims) {
      Candidate& cand = candidate(c.set, c.canonical, pos);
      cand.entries.push_back(pos);
      CandidateTensor& ct = cand.tensors[c.tensor];
      ct.entries.push_back(pos);
      if (c.part < 0) {
        ct.stacked = &e;
        ct.unit_dim = c.unit_dim;
      } else {
        ct.parts[static_cast<size_t>(c.part)][c.expert] = &e;
        if (cand.spelled.empty()) cand.spelled = c.prefix;
      }
    }
    ++pos;
  }

  // Checks, in the order of each candidate's first entry.
  std::sort(candidates.begin(), candidates.end(),
            [](const Candidate& a, const Candidate& b) { return a.first_entry < b.first_entry; });
  std::vector<std::pair<size_t, Error>> problems = std::move(conflicts);
  std::vector<const std::string*> key_at;
  for (const Entry& e : dict) key_at.push_back(&e.first);
  for (const Candidate& c : candidates) {
    const LayoutRules& r = rules[c.set];
    const CandidateTensor& anchor = c.tensors[0];
    if (anchor.stacked == nullptr && !anchor.per_expert()) {
      // Per-expert entries of other tensors without the first one are a broken module; stacked
      // ones alone are ordinary entries (a rank-2 "lone.bias").
      for (size_t t = 1; t < c.tensors.size(); ++t) {
        if (const Entry* e = c.tensors[t].first_per_expert()) {
          const KeyPattern& p = compiled[c.set].parts[0][0];
          problems.emplace_back(
              c.first_entry,
              Error(ErrorCode::PartialExpertSet,
                    module_name(c.spelled) + ": has " + quote(e->first) + " but no " +
                        quote(p.format(c.spelled, 0)) + " (" + r.tensors[t].stacked.substr(8) +
                        " without " + r.tensors[0].stacked.substr(8) + ")"));
          out.matched[c.set] = true;
          break;
        }
      }
      continue;
    }
    if (c.spoiled && !anchor.per_expert()) continue;  // a convolution, not a grouped module
    out.matched[c.set] = true;
    std::optional<Error> problem;
    Checker checker(c, r, compiled[c.set]);
    std::optional<FoundModule> m = checker.check(problem);
    if (!m) {
      problems.emplace_back(c.first_entry, *problem);
      continue;
    }
    GroupedModule g;
    g.prefix = anchor.per_expert() ? c.spelled : c.canonical;
    g.rules = r.name;
    g.layout = anchor.stacked ? ExpertLayout::Single : ExpertLayout::PerExpert;
    for (size_t t = 0; t < m->tensors.size(); ++t) {
      const FoundTensor& f = m->tensors[t];
      if (!f.present) continue;
      ExpertTensor et;
      et.name = compiled[c.set].stacked[t].format(c.canonical);
      for (size_t at : c.tensors[t].entries) et.keys.push_back(*key_at[at]);
      et.layout = f.stacked ? ExpertLayout::Single : ExpertLayout::PerExpert;
      et.expert_shape = f.part_shape;
      for (size_t p = 1; p < f.part_rows.size(); ++p) et.expert_shape[0] += f.part_rows[p];
      et.dtype = f.stacked ? f.stacked->second.dtype() : f.parts[0].begin()->second->second.dtype();
      g.mixed = g.mixed || et.layout != g.layout;
      if (t == 0) {
        g.num_experts =
            f.stacked ? f.stacked->second.dim(0) : static_cast<int64_t>(f.parts[0].size());
        g.dtype = et.dtype;
        if (et.expert_shape.size() == 2) {
          g.out_features = et.expert_shape[0];
          g.in_features = et.expert_shape[1];
        }
      }
      if (et.name == c.canonical + "bias") {
        g.bias = true;
        g.bias_dtype = et.dtype;
      }
      g.tensors.push_back(std::move(et));
    }
    for (size_t at : c.entries) g.keys.push_back(*key_at[at]);
    out.found.push_back(std::move(*m));
    out.scan.modules.push_back(std::move(g));
  }
  std::stable_sort(problems.begin(), problems.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [p, e] : problems) out.scan.problems.push_back(std::move(e));
  return out;
}

}  // namespace grouplin::layout
