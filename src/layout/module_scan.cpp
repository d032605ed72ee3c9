// Finding grouped modules by layout rules: the claims of each key, the candidates they make, and
// the report of what was found (see include/grouplin/checkpoint_layout.hpp for the contract).
#include "layout/module_scan.hpp"

#include <algorithm>
#include <map>
#include <utility>

#include "layout/renames.hpp"

namespace grouplin::layout {
namespace {

// One rule-set pattern that matches a key.
struct Claim {
  size_t set, tensor;
  int part;  // -1: stacked
  int64_t expert;
  std::string canonical, spelled;
  bool unit_dim;
};

// A candidate that failed its checks, or a conflict, at its first entry's dict position.
struct ScanProblem {
  size_t position;
  size_t set;  // the candidate's set; the number of sets for a conflict
  Error error;
};

// Gathers the claims of every key into candidates, one per (set, canonical prefix).
class Claims {
 public:
  Claims(const StateDict& dict, const std::vector<CompiledRules>& sets, bool explicit_rules)
      : dict_(dict), sets_(sets), explicit_(explicit_rules) {}

  void run(std::vector<ScanProblem>& problems);
  std::vector<Candidate>& candidates() { return candidates_; }
  // Scales whose weight is not beside them: (set, canonical prefix, dict position, weight key).
  struct LoneScale {
    size_t set;
    std::string canonical;
    size_t pos;
    std::string weight_key;
  };
  const std::vector<LoneScale>& lone_scales() const { return lone_scales_; }
  // Whether set `set` claimed anything under `canonical` (a candidate, checked or not).
  bool has_candidate(size_t set, const std::string& canonical) const {
    return by_key_.count({set, canonical}) != 0;
  }

 private:
  std::vector<Claim> claims_of(const Entry& e, size_t pos);
  // For a scale tensor t of set c: whether the entry of the weight it scales is in the dict,
  // with that weight's rank (part -1: stacked; else that part of `expert`).
  bool weight_beside(const CompiledRules& c, size_t t, int part, std::string_view prefix,
                     int64_t expert) const;
  Candidate& candidate(size_t set, const std::string& canonical, size_t pos);
  Error conflict(const Entry& e, const std::vector<Claim>& claims) const;

  const StateDict& dict_;
  const std::vector<CompiledRules>& sets_;
  bool explicit_;
  std::vector<Candidate> candidates_;
  std::map<std::pair<size_t, std::string>, size_t> by_key_;
  std::vector<LoneScale> lone_scales_;
};

Candidate& Claims::candidate(size_t set, const std::string& canonical, size_t pos) {
  auto [it, added] = by_key_.emplace(std::pair(set, canonical), candidates_.size());
  if (added) {
    Candidate c;
    c.set = set;
    c.canonical = canonical;
    c.first_entry = pos;
    const LayoutRules& r = sets_[set].rules;
    c.tensors.resize(r.tensors.size());
    for (size_t t = 0; t < r.tensors.size(); ++t)
      c.tensors[t].parts.resize(r.tensors[t].parts.size());
    candidates_.push_back(std::move(c));
  }
  return candidates_[it->second];
}

bool Claims::weight_beside(const CompiledRules& c, size_t t, int part, std::string_view prefix,
                           int64_t expert) const {
  if (c.scale_of[t] < 0) return true;
  const auto w = static_cast<size_t>(c.scale_of[t]);
  const StackedTensorRule& rule = c.rules.tensors[w];
  const std::string key = part < 0 ? c.stacked[w].format(prefix)
                                   : c.parts[w][static_cast<size_t>(part)].format(prefix, expert);
  const Tensor* weight = dict_.find(key);
  const size_t rank = rule.dims.size() + (part < 0 && !rule.folded ? 1 : 0);
  return weight != nullptr && weight->rank() == rank;
}

std::vector<Claim> Claims::claims_of(const Entry& e, size_t pos) {
  std::vector<Claim> claims;
  for (size_t s = 0; s < sets_.size(); ++s) {
    const CompiledRules& c = sets_[s];
    const LayoutRules& r = c.rules;
    // Stacked names (and a TE-only set's per-expert names) are matched as the single layout
    // spells them; native per-expert names as the key spells them.
    const std::string single_key = r.renames.empty() ? e.first : renamed(e.first, r, true);
    const bool te_only = r.per_expert == PerExpertForm::TeOnly;
    for (size_t t = 0; t < r.tensors.size(); ++t) {
      const StackedTensorRule& rule = r.tensors[t];
      auto fits = [&](std::string_view prefix) { return prefix.ends_with(r.prefix_ends_with); };
      if (auto m = c.stacked[t].match(single_key); m && fits(m->prefix)) {
        const Tensor& v = e.second;
        const size_t rank = rule.dims.size() + (rule.folded ? 0 : 1);
        const bool unit = rule.unit_dim && v.rank() == rank + 1 && v.dim(1) == 1;
        if (c.scale_of[t] >= 0) {
          // A scale of any rank that has experts, beside its stacked weight: TE's
          // "P.weight_scale_inv" is no scale beside a per-expert "P.weight" [out, in].
          if (v.rank() >= 1 && weight_beside(c, t, -1, m->prefix, 0)) {
            claims.push_back({s, t, -1, -1, std::string(m->prefix), "", false});
          } else {
            const auto w = static_cast<size_t>(c.scale_of[t]);
            lone_scales_.push_back(
                {s, std::string(m->prefix), pos, c.stacked[w].format(m->prefix)});
          }
        } else if (v.rank() == rank || unit) {
          claims.push_back({s, t, -1, -1, std::string(m->prefix), "", unit});
        } else if (t != 0) {
          candidate(s, std::string(m->prefix), pos).spoiled = true;
        }
      }
      for (size_t p = 0; p < rule.parts.size(); ++p) {
        const std::string& key = te_only ? single_key : e.first;
        auto m = c.parts[t][p].match(key);
        if (m && fits(m->prefix) &&
            !weight_beside(c, t, static_cast<int>(p), m->prefix, m->expert)) {
          const auto w = static_cast<size_t>(c.scale_of[t]);
          const std::string prefix(m->prefix);
          lone_scales_.push_back({s, te_only ? prefix : renamed(prefix, r, true), pos,
                                  c.parts[w][p].format(prefix, m->expert)});
        } else if (m && fits(m->prefix)) {
          std::string spelled(m->prefix);
          std::string canonical = te_only ? spelled : renamed(spelled, r, true);
          claims.push_back({s, t, static_cast<int>(p), m->expert, std::move(canonical),
                            std::move(spelled), false});
        }
      }
    }
  }
  return claims;
}

Error Claims::conflict(const Entry& e, const std::vector<Claim>& claims) const {
  std::string who;
  for (const Claim& c : claims) {
    const StackedTensorRule& r = sets_[c.set].rules.tensors[c.tensor];
    who += (who.empty() ? "" : " and ") + quote(c.part < 0 ? r.stacked : r.parts[c.part]) + " (" +
           sets_[c.set].rules.name + ")";
  }
  return Error(ErrorCode::RuleConflict, "entry " + quote(e.first) + " is claimed by " + who);
}

void Claims::run(std::vector<ScanProblem>& problems) {
  size_t pos = 0;
  for (const Entry& e : dict_) {
    std::vector<Claim> claims = claims_of(e, pos);
    if (claims.size() > 1) {
      const bool same_set = std::all_of(claims.begin(), claims.end(),
                                        [&](const Claim& c) { return c.set == claims[0].set; });
      if (explicit_ || same_set) {
        problems.push_back({pos++, sets_.size(), conflict(e, claims)});
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
        if (cand.spelled.empty()) cand.spelled = c.spelled;
      }
    }
    ++pos;
  }
}

// The public description of a module that passed its checks.
GroupedModule report(const Candidate& c, const FoundModule& m, const CompiledRules& set,
                     const std::vector<const std::string*>& key_at) {
  const LayoutRules& r = set.rules;
  const CandidateTensor& anchor = c.tensors[0];
  GroupedModule g;
  g.prefix = anchor.per_expert() ? m.spelled : c.canonical;
  g.rules = r.name;
  g.stacked_only = r.per_expert == PerExpertForm::TeOnly;
  g.grouped_linear_names = r.grouped_linear_names;
  g.layout = anchor.stacked ? ExpertLayout::Single : ExpertLayout::PerExpert;
  g.num_experts = m.num_experts;
  for (size_t t = 0; t < m.tensors.size(); ++t) {
    const FoundTensor& f = m.tensors[t];
    if (!f.present) continue;
    ExpertTensor et;
    et.name = set.stacked[t].format(c.canonical);
    for (size_t at : c.tensors[t].entries) et.keys.push_back(*key_at[at]);
    et.layout = f.stacked ? ExpertLayout::Single : ExpertLayout::PerExpert;
    et.expert_shape = f.part_shape;
    for (size_t p = 1; p < f.part_rows.size(); ++p) et.expert_shape[0] += f.part_rows[p];
    et.dtype = f.stacked ? f.stacked->second.dtype() : f.parts[0].begin()->second->second.dtype();
    et.transposed = r.tensors[t].transposed;
    et.interleave = r.tensors[t].interleave;
    et.folded = r.tensors[t].folded;
    if (set.scale_of[t] >= 0) {
      et.scale_of = set.stacked[static_cast<size_t>(set.scale_of[t])].format(c.canonical);
      et.block = f.block;
    }
    g.mixed = g.mixed || et.layout != g.layout;
    if (t == 0) {
      g.dtype = et.dtype;
      if (et.expert_shape.size() == 2) {
        g.out_features = et.expert_shape[0];
        g.in_features = et.expert_shape[1];
      }
    }
    if (!g.bias && et.name.ends_with("bias")) {
      g.bias = true;
      g.bias_dtype = et.dtype;
    }
    g.tensors.push_back(std::move(et));
  }
  for (size_t at : c.entries) g.keys.push_back(*key_at[at]);
  return g;
}

// Per-expert entries of other tensors without the first one are a broken module; stacked ones
// alone are ordinary entries (a rank-2 "lone.bias").
std::optional<Error> orphan_problem(const Candidate& c, const CompiledRules& set) {
  const LayoutRules& r = set.rules;
  for (size_t t = 1; t < c.tensors.size(); ++t) {
    if (const Entry* e = c.tensors[t].first_per_expert()) {
      const std::string spelled = c.spelled.empty() ? c.canonical : c.spelled;
      return Error(ErrorCode::PartialExpertSet,
                   module_name(spelled) + ": has " + quote(e->first) + " but no " +
                       quote(set.parts[0][0].format(spelled, 0)) + " (" +
                       r.tensors[t].stacked.substr(8) + " without " +
                       r.tensors[0].stacked.substr(8) + ")");
    }
  }
  return std::nullopt;
}

}  // namespace

ModuleScan scan_modules(const StateDict& dict, const std::vector<CompiledRules>& sets,
                        bool explicit_rules, const std::vector<std::string>& declared) {
  ModuleScan out;
  out.matched.assign(sets.size(), false);
  std::vector<ScanProblem> problems;
  std::vector<size_t> problem_entries;  // dict positions of the failed candidates' entries
  Claims claims(dict, sets, explicit_rules);
  claims.run(problems);
  std::vector<Candidate>& candidates = claims.candidates();

  // Checks, in the order of each candidate's first entry.
  std::sort(candidates.begin(), candidates.end(),
            [](const Candidate& a, const Candidate& b) { return a.first_entry < b.first_entry; });
  std::vector<const std::string*> key_at;
  for (const Entry& e : dict) key_at.push_back(&e.first);
  for (const Candidate& c : candidates) {
    const CompiledRules& set = sets[c.set];
    const CandidateTensor& anchor = c.tensors[0];
    if (anchor.stacked == nullptr && !anchor.per_expert()) {
      if (std::optional<Error> e = orphan_problem(c, set)) {
        problems.push_back({c.first_entry, c.set, *e});
        for (size_t at : c.entries) problem_entries.push_back(at);
        out.matched[c.set] = true;
      }
      continue;
    }
    const bool any_per_expert =
        std::any_of(c.tensors.begin(), c.tensors.end(),
                    [](const CandidateTensor& t) { return t.per_expert(); });
    if (c.spoiled && !anchor.per_expert()) continue;  // a convolution, not a grouped module
    // Detected rules: a stacked first tensor needs its set's companion entry (te: _extra_state)
    // or the checkpoint's declaration, or it may be an ordinary tensor that happens to have the
    // rank (conv1d [C, 1, K]). Other tensors of the set beside it that agree with it (a stacked
    // bias [N, out], scales) make it a module all the same: a convolution's bias has rank 1
    // (spoiled above). Unconfirmed, it is never a problem: it may be no module at all.
    const bool unconfirmed =
        !explicit_rules && set.stacked_needs && !any_per_expert &&
        !dict.contains(set.stacked_needs->format(c.canonical)) &&
        std::find(declared.begin(), declared.end(), c.canonical) == declared.end();
    const bool alone = std::none_of(c.tensors.begin() + 1, c.tensors.end(),
                                    [](const CandidateTensor& t) { return !t.entries.empty(); });
    auto leave_unconfirmed = [&] {
      out.scan.unconfirmed.push_back({c.canonical, set.stacked[0].format(c.canonical),
                                      set.stacked_needs->format(c.canonical), set.rules.name});
    };
    if (unconfirmed && alone) {
      leave_unconfirmed();
      continue;
    }
    // A set that folds its experts into dim 0 counts them by another entry (DBRX's router).
    std::optional<int64_t> folded_experts;
    if (set.experts_from) {
      const Tensor* counter = dict.find(set.experts_from->format(c.canonical));
      const auto dim = static_cast<size_t>(set.rules.experts_from_dim);
      if (counter != nullptr && dim < counter->rank()) folded_experts = counter->dim(dim);
      if (!folded_experts && !explicit_rules && !any_per_expert) continue;  // no such module
    }
    std::optional<Error> problem;
    std::optional<FoundModule> m = check_candidate(c, c.set, set, folded_experts, problem);
    if (!m && unconfirmed) {
      leave_unconfirmed();
      continue;
    }
    out.matched[c.set] = true;
    if (!m) {
      problems.push_back({c.first_entry, c.set, *problem});
      for (size_t at : c.entries) problem_entries.push_back(at);
      continue;
    }
    out.scan.modules.push_back(report(c, *m, set, key_at));
    out.found.push_back(std::move(*m));
  }
  // A scale without its weight under a module's prefix is that module's problem; elsewhere it
  // is an ordinary entry (TE's names would take "x.gate_proj.weight_scale_inv" for a scale).
  for (const Claims::LoneScale& s : claims.lone_scales()) {
    if (!claims.has_candidate(s.set, s.canonical)) continue;
    problems.push_back(
        {s.pos, s.set,
         Error(ErrorCode::PartialExpertSet,
               module_name(s.canonical) + ": has the scales " + quote(*key_at[s.pos]) +
                   " but not the weight they scale, " + quote(s.weight_key))});
    problem_entries.push_back(s.pos);
  }
  std::stable_sort(problems.begin(), problems.end(),
                   [](const auto& a, const auto& b) { return a.position < b.position; });
  for (ScanProblem& p : problems) {
    out.problem_sets.push_back(p.set);
    out.scan.problems.push_back(std::move(p.error));
  }
  std::sort(problem_entries.begin(), problem_entries.end());
  problem_entries.erase(std::unique(problem_entries.begin(), problem_entries.end()),
                        problem_entries.end());
  for (size_t at : problem_entries) out.scan.problem_keys.push_back(*key_at[at]);
  return out;
}

}  // namespace grouplin::layout
