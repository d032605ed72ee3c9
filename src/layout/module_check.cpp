// The checks of one candidate module (layout/module_check.hpp; the problem codes are listed in
// include/grouplin/checkpoint_layout.hpp).
#include "layout/module_check.hpp"

#include <algorithm>

#include "core/fp8.hpp"
#include "layout/renames.hpp"

namespace grouplin::layout {
namespace {

// Missing indices quoted in one PartialExpertSet message.
constexpr size_t kMaxListed = 8;

std::string dims_text(const std::vector<std::string>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + dims[i];
  return s + "]";
}

class Checker {
 public:
  Checker(const Candidate& c, const CompiledRules& compiled, std::optional<int64_t> folded_experts)
      : c_(c),
        rules_(compiled.rules),
        compiled_(compiled),
        folded_experts_(folded_experts),
        what_(module_name(prefix_for_messages())) {}

  std::optional<FoundModule> check(std::optional<Error>& problem);

 private:
  std::string prefix_for_messages() const { return c_.spelled.empty() ? c_.canonical : c_.spelled; }
  Error fail(ErrorCode code, const std::string& message) const {
    return Error(code, what_ + ": " + message);
  }
  // One tensor's own checks; fills `out` and its expert count `n`.
  std::optional<Error> check_tensor(size_t t, FoundTensor& out, int64_t& n) const;
  std::optional<Error> check_stacked(size_t t, FoundTensor& out, int64_t& n) const;
  std::optional<Error> check_per_expert(size_t t, FoundTensor& out, int64_t& n) const;
  // The named dims of one part of one expert against those already seen.
  std::optional<Error> check_dims(size_t t, const Entry& e, const Shape& part_shape, bool stacked,
                                  int64_t n);
  // The module's expert count against the one its first tensor set.
  std::optional<Error> check_count(size_t t, int64_t n, int64_t n_module) const;
  // Scales (tensor t) against the blocks of the weight they scale; sets their block and rows.
  std::optional<Error> check_scale(size_t t, FoundModule& m) const;
  bool is_scale(size_t t) const { return compiled_.scale_of[t] >= 0; }

  const Candidate& c_;
  const LayoutRules& rules_;
  const CompiledRules& compiled_;
  std::optional<int64_t> folded_experts_;
  std::string what_;
  std::map<std::string, int64_t> dims_;
  std::map<std::string, std::string> dim_source_;
};

std::optional<Error> Checker::check_tensor(size_t t, FoundTensor& out, int64_t& n) const {
  return c_.tensors[t].stacked != nullptr ? check_stacked(t, out, n) : check_per_expert(t, out, n);
}

std::optional<Error> Checker::check_stacked(size_t t, FoundTensor& out, int64_t& n) const {
  const CandidateTensor& ct = c_.tensors[t];
  const StackedTensorRule& rule = rules_.tensors[t];
  const auto nparts = static_cast<int64_t>(rule.parts.size());
  const Tensor& s = ct.stacked->second;
  const std::string what = quote(ct.stacked->first) + " has shape " + shape_to_string(s.shape());
  Shape expert;
  if (rule.folded) {  // [N * rows, ...]: N from the experts_from entry
    const std::string counter = compiled_.experts_from->format(c_.canonical);
    if (!folded_experts_) {
      return fail(ErrorCode::PartialExpertSet,
                  what + " folds its experts into dim 0, but there is no " + quote(counter) +
                      " to count them by");
    }
    n = *folded_experts_;
    if (n <= 0 || s.dim(0) % n != 0) {
      return fail(ErrorCode::ShapeMismatch, what + ": " + std::to_string(s.dim(0)) +
                                                " rows do not split into " + std::to_string(n) +
                                                " experts (" + quote(counter) + ")");
    }
    expert = s.shape();
    expert[0] /= n;
    out.folded_rows = expert[0];
  } else {
    n = s.dim(0);
    expert.assign(s.shape().begin() + (ct.unit_dim ? 2 : 1), s.shape().end());
  }
  if (n == 0) {
    return fail(ErrorCode::ShapeMismatch,
                what + ": no experts (a grouped module has at least one)");
  }
  if (is_scale(t)) {  // rows per part come from the weight's blocks (check_scale)
    out.stacked = ct.stacked;
    out.part_shape = expert;
    out.part_rows = {expert.empty() ? 1 : expert[0]};
    out.part_rows.resize(static_cast<size_t>(nparts), 0);
    return std::nullopt;
  }
  if (rule.transposed) std::swap(expert[0], expert[1]);  // stored [in, out]
  if (expert[0] % nparts != 0) {
    return fail(ErrorCode::ShapeMismatch, what + ": " + std::to_string(expert[0]) +
                                              " rows per expert do not split into " +
                                              std::to_string(nparts) + " equal parts");
  }
  if (rule.interleave > 1 && expert[0] % rule.interleave != 0) {
    return fail(ErrorCode::ShapeMismatch,
                what + ": " + std::to_string(expert[0]) + " rows per expert do not split into " +
                    std::to_string(rule.interleave) + " interleaved groups");
  }
  out.stacked = ct.stacked;
  out.unit_dim = ct.unit_dim;
  out.part_rows.assign(static_cast<size_t>(nparts), expert[0] / nparts);
  out.part_shape = expert;
  out.part_shape[0] = out.part_rows[0];
  return std::nullopt;
}

// Per-expert: every part holds experts 0..n-1, all of one shape and dtype.
std::optional<Error> Checker::check_per_expert(size_t t, FoundTensor& out, int64_t& n) const {
  const CandidateTensor& ct = c_.tensors[t];
  const StackedTensorRule& rule = rules_.tensors[t];
  const size_t nparts = rule.parts.size();
  n = 0;
  for (const auto& part : ct.parts) {
    if (!part.empty()) n = std::max(n, part.rbegin()->first + 1);
  }
  const Entry* first = ct.first_per_expert();
  for (size_t p = 0; p < nparts; ++p) {
    const auto& part = ct.parts[p];
    const std::string first_key = compiled_.parts[t][p].format(prefix_for_messages(), 0);
    if (part.empty()) {
      return fail(ErrorCode::PartialExpertSet,
                  "has " + quote(first->first) + " but no " + quote(first_key));
    }
    if (static_cast<int64_t>(part.size()) != n) {
      return fail(ErrorCode::PartialExpertSet,
                  "has " + std::to_string(part.size()) + " experts of " + quote(first_key) +
                      " up to " + quote(part.rbegin()->second->first) + " but lacks " +
                      missing_list(part, n, compiled_.parts[t][p], prefix_for_messages()));
    }
  }
  const Tensor& t0 = first->second;
  if (t0.rank() != rule.dims.size() && !is_scale(t)) {
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
  const int64_t rows = t0.rank() == 0 ? 0 : out.part_rows.front();
  if (rule.interleave > 1 && rows % rule.interleave != 0) {
    return fail(ErrorCode::ShapeMismatch,
                quote(first->first) + " has shape " + shape_to_string(t0.shape()) + ": " +
                    std::to_string(rows) + " rows do not split into " +
                    std::to_string(rule.interleave) + " interleaved groups");
  }
  out.part_shape = t0.shape();
  return std::nullopt;
}

std::optional<Error> Checker::check_dims(size_t t, const Entry& e, const Shape& part_shape,
                                         bool stacked, int64_t n) {
  const StackedTensorRule& rule = rules_.tensors[t];
  const std::vector<std::string>& dims = rule.dims;
  Shape want = part_shape;
  std::string because;
  for (size_t d = 0; d < dims.size(); ++d) {
    auto it = dims_.find(dims[d]);
    if (it == dims_.end() || it->second == part_shape[d]) continue;
    want[d] = it->second;
    because = dims[d] + " = " + std::to_string(it->second) + " from " + dim_source_[dims[d]];
  }
  if (!because.empty()) {
    // The whole entry as it should be: for a stacked one, its parts' rows, transposed as stored.
    Shape full = want;
    if (stacked) {
      full[0] *= static_cast<int64_t>(rule.parts.size());
      if (rule.transposed) std::swap(full[0], full[1]);
      if (c_.tensors[t].unit_dim) full.insert(full.begin(), 1);
      if (rule.folded) {
        full[0] *= n;
      } else {
        full.insert(full.begin(), n);
      }
    }
    return fail(ErrorCode::ShapeMismatch, quote(e.first) + " has shape " +
                                              shape_to_string(e.second.shape()) + ", expected " +
                                              shape_to_string(full) + " (" + because + ")");
  }
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims_.emplace(dims[d], part_shape[d]).second) dim_source_[dims[d]] = quote(e.first);
  }
  return std::nullopt;
}

std::optional<Error> Checker::check_count(size_t t, int64_t n, int64_t n_module) const {
  if (n == n_module) return std::nullopt;
  const CandidateTensor& ct = c_.tensors[t];
  if (ct.stacked != nullptr) {
    Shape want = ct.stacked->second.shape();
    want[0] = rules_.tensors[t].folded ? want[0] / n * n_module : n_module;
    return fail(ErrorCode::ShapeMismatch, quote(ct.stacked->first) + " has shape " +
                                              shape_to_string(ct.stacked->second.shape()) +
                                              ", expected " + shape_to_string(want) + " (" +
                                              std::to_string(n_module) + " experts)");
  }
  if (n > n_module) {
    const auto& part = ct.parts[0].empty() ? ct.parts.back() : ct.parts[0];
    return fail(ErrorCode::PartialExpertSet, "has " + quote(part.rbegin()->second->first) +
                                                 " but only " + std::to_string(n_module) +
                                                 " experts");
  }
  return fail(
      ErrorCode::PartialExpertSet,
      "has " + quote(compiled_.stacked[t].format(c_.canonical)) + " entries for " +
          std::to_string(n) + " of its " + std::to_string(n_module) + " experts; lacks " +
          missing_list(ct.parts[0], n_module, compiled_.parts[t][0], prefix_for_messages()));
}

std::optional<FoundModule> Checker::check(std::optional<Error>& problem) {
  FoundModule m;
  m.canonical = c_.canonical;
  // Per-expert names spell the prefix as the per-expert entries do; a module met stacked only
  // gets the renames undone (a TE-only set's per-expert names are spelled like its single ones).
  m.spelled = !c_.spelled.empty()                          ? c_.spelled
              : rules_.per_expert == PerExpertForm::TeOnly ? c_.canonical
                                                           : renamed(c_.canonical, rules_, false);
  m.first_entry = c_.first_entry;
  m.tensors.resize(rules_.tensors.size());
  int64_t n_module = -1;
  for (size_t t = 0; t < rules_.tensors.size(); ++t) {
    const CandidateTensor& ct = c_.tensors[t];
    const bool stacked = ct.stacked != nullptr;
    if (!stacked && !ct.per_expert()) {
      if (!rules_.tensors[t].optional) {
        const CandidateTensor& anchor = c_.tensors[0];
        problem = fail(
            ErrorCode::PartialExpertSet,
            "has " +
                quote(anchor.stacked ? anchor.stacked->first : anchor.first_per_expert()->first) +
                " but no " + quote(compiled_.stacked[t].format(c_.canonical)) + " (single) nor " +
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
    if ((problem = check_tensor(t, out, n))) return std::nullopt;
    if (n_module < 0) n_module = n;
    if ((problem = check_count(t, n, n_module))) return std::nullopt;
    // Dims agree across the module's tensors, part by part; scales go by their weight's blocks.
    for (size_t p = 0; p < rules_.tensors[t].parts.size() && !is_scale(t); ++p) {
      Shape part_shape = out.part_shape;
      if (!part_shape.empty()) part_shape[0] = out.part_rows[p];
      const Entry* e = stacked ? ct.stacked : ct.parts[p].begin()->second;
      if ((problem = check_dims(t, *e, part_shape, stacked, n_module))) return std::nullopt;
    }
  }
  m.num_experts = n_module;
  for (size_t t = 0; t < rules_.tensors.size(); ++t) {
    if (is_scale(t) && m.tensors[t].present && (problem = check_scale(t, m))) return std::nullopt;
  }
  return m;
}

std::optional<Error> Checker::check_scale(size_t t, FoundModule& m) const {
  const auto w = static_cast<size_t>(compiled_.scale_of[t]);
  const StackedTensorRule& rule = rules_.tensors[t];
  FoundTensor& scales = m.tensors[t];
  const FoundTensor& weight = m.tensors[w];
  const CandidateTensor& ct = c_.tensors[t];
  const Entry* scale_entry = ct.stacked != nullptr ? ct.stacked : ct.first_per_expert();
  const std::string weight_name = quote(compiled_.stacked[w].format(c_.canonical));
  if (!weight.present) {
    return fail(ErrorCode::PartialExpertSet, "has the scales " + quote(scale_entry->first) +
                                                 " but not the weight they scale, " + weight_name);
  }
  if (weight.part_shape.size() != 2) {
    return fail(ErrorCode::ScaleShapeMismatch,
                quote(scale_entry->first) + " scales " + weight_name + ", whose experts are " +
                    shape_to_string(weight.part_shape) + ", not [out, in] matrices");
  }
  const size_t nparts = rule.parts.size();
  const int64_t cols = weight.part_shape[1];
  int64_t rows = 0;
  for (int64_t r : weight.part_rows) rows += r;
  // The scale shapes of one expert as stored: the stacked whole, or one per part.
  std::vector<Shape> stored;
  if (ct.stacked != nullptr) {
    stored.push_back(scales.part_shape);
  } else {
    for (size_t p = 0; p < nparts; ++p)
      stored.push_back(scales.parts[p].begin()->second->second.shape());
  }
  std::string expected;
  for (const std::vector<int64_t>& b : rule.blocks) {
    std::vector<Shape> want;
    if (b.empty() || ct.stacked != nullptr) {  // one shape over the expert's whole rows
      want.push_back(core::block_scale_shape(rows, cols, b));
    } else {
      for (size_t p = 0; p < nparts; ++p) {
        want.push_back(core::block_scale_shape(weight.part_rows[p], cols, b));
      }
    }
    // One per expert fits a scale of one value in any shape ([1], [], [1, 1]).
    const bool fits = b.empty() ? nparts == 1 && shape_numel(stored[0]) == 1 : stored == want;
    if (!fits) {
      expected += (expected.empty() ? "" : " or ") + core::expected_scales(want[0], b, "expert");
      continue;
    }
    scales.block = b;
    for (size_t p = 0; p + 1 < nparts && !b.empty(); ++p) {
      scales.blocks_aligned = scales.blocks_aligned && weight.part_rows[p] % b[0] == 0;
    }
    if (ct.stacked != nullptr && scales.blocks_aligned && !b.empty()) {
      int64_t left = scales.part_shape[0];
      for (size_t p = 0; p < nparts; ++p) {
        scales.part_rows[p] = p + 1 < nparts ? weight.part_rows[p] / b[0] : left;
        left -= scales.part_rows[p];
      }
      scales.part_shape[0] = scales.part_rows[0];
    }
    return std::nullopt;
  }
  return fail(
      ErrorCode::ScaleShapeMismatch,
      quote(scale_entry->first) + " has shape " + shape_to_string(scale_entry->second.shape()) +
          " per expert " + shape_to_string(stored[0]) + "; the scales of " + weight_name + " (" +
          std::to_string(rows) + " x " + std::to_string(cols) + " per expert) are " + expected);
}

}  // namespace

bool CandidateTensor::per_expert() const {
  return std::any_of(parts.begin(), parts.end(), [](const auto& p) { return !p.empty(); });
}

const Entry* CandidateTensor::first_per_expert() const {
  for (const auto& p : parts) {
    if (!p.empty()) return p.begin()->second;
  }
  return nullptr;
}

std::string module_name(const std::string& prefix) {
  return prefix.empty() ? std::string("grouped module at the root")
                        : "grouped module " + quote(prefix);
}

std::string missing_list(const std::map<int64_t, const Entry*>& present, int64_t n,
                         const KeyPattern& pattern, const std::string& prefix) {
  std::string out;
  size_t listed = 0;
  for (int64_t i = 0; i < n && listed < kMaxListed; ++i) {
    if (present.count(i)) continue;
    out += (listed ? ", " : "") + quote(pattern.format(prefix, i));
    ++listed;
  }
  // Every index present is below n: a count, not a walk over up to a billion indices.
  const uint64_t missing = static_cast<uint64_t>(n) - present.size();
  if (missing > listed) out += " and " + std::to_string(missing - listed) + " more";
  return out;
}

std::optional<FoundModule> check_candidate(const Candidate& c, size_t set,
                                           const CompiledRules& rules,
                                           std::optional<int64_t> folded_experts,
                                           std::optional<Error>& problem) {
  Checker checker(c, rules, folded_experts);
  std::optional<FoundModule> m = checker.check(problem);
  if (m) m->rules = set;
  return m;
}

}  // namespace grouplin::layout
