// Grouped modules by layout rules, and conversion plans as lists of views (see
// include/grouplin/checkpoint_layout.hpp). The scan itself is layout/module_scan.cpp.
#include "grouplin/checkpoint_layout.hpp"

#include <unordered_map>

#include "layout/key_pattern.hpp"
#include "layout/module_scan.hpp"

namespace grouplin {
namespace {

const std::vector<LayoutRules>& or_detected(const std::vector<LayoutRules>& rules,
                                            const StateDict& dict, std::vector<LayoutRules>& own,
                                            std::string_view model_type) {
  if (!rules.empty()) return rules;
  own = detect_rules(dict, model_type);
  return own;
}

// Emits one module in the target layout, as views of its entries.
class ModulePlanner {
 public:
  ModulePlanner(const layout::FoundModule& f, const GroupedModule& g, const LayoutRules& r,
                int64_t begin, int64_t end)
      : f_(f), g_(g), r_(r), begin_(begin), end_(end) {
    std::string error;
    for (const StackedTensorRule& t : r.tensors) {
      stacked_.push_back(*layout::KeyPattern::compile(t.stacked, false, error));
      parts_.emplace_back();
      for (const std::string& p : t.parts) {
        parts_.back().push_back(*layout::KeyPattern::compile(p, true, error));
      }
    }
  }

  void single(std::vector<PlannedTensor>& out) const {
    for (size_t t = 0; t < f_.tensors.size(); ++t) {
      const layout::FoundTensor& ft = f_.tensors[t];
      if (!ft.present) continue;
      const ExpertTensor& et = tensor_info(t);
      PlannedTensor p{stacked_[t].format(f_.canonical), et.dtype, et.expert_shape, {}};
      p.shape.insert(p.shape.begin(), end_ - begin_);
      if (ft.stacked != nullptr) {
        p.pieces.push_back(ft.stacked->second.rows(begin_, end_ - begin_));
      } else {
        for (int64_t e = begin_; e < end_; ++e) {
          for (const auto& part : ft.parts) p.pieces.push_back(part.at(e)->second);
        }
      }
      out.push_back(std::move(p));
    }
  }

  void per_expert(std::vector<PlannedTensor>& out) const {
    if (r_.expert_major) {
      for (int64_t e = begin_; e < end_; ++e) {
        for (size_t t = 0; t < f_.tensors.size(); ++t) expert_parts(t, e, out);
      }
    } else {
      for (size_t t = 0; t < f_.tensors.size(); ++t) {
        for (int64_t e = begin_; e < end_; ++e) expert_parts(t, e, out);
      }
    }
  }

 private:
  const ExpertTensor& tensor_info(size_t t) const {
    size_t k = 0;  // g_.tensors holds only the present tensors
    for (size_t i = 0; i < t; ++i) k += f_.tensors[i].present;
    return g_.tensors[k];
  }

  void expert_parts(size_t t, int64_t e, std::vector<PlannedTensor>& out) const {
    const layout::FoundTensor& ft = f_.tensors[t];
    if (!ft.present) return;
    Tensor slice;
    if (ft.stacked != nullptr) {
      slice = ft.stacked->second.select(e);
      if (ft.unit_dim) slice = slice.select(0);
    }
    int64_t row = 0;
    for (size_t p = 0; p < parts_[t].size(); ++p) {
      const std::string name = parts_[t][p].format(f_.spelled, e - begin_);
      const Tensor piece =
          ft.stacked != nullptr ? slice.rows(row, ft.part_rows[p]) : ft.parts[p].at(e)->second;
      row += ft.part_rows[p];
      out.push_back(PlannedTensor::of(name, piece));
    }
  }

  const layout::FoundModule& f_;
  const GroupedModule& g_;
  const LayoutRules& r_;
  int64_t begin_, end_;
  std::vector<layout::KeyPattern> stacked_;
  std::vector<std::vector<layout::KeyPattern>> parts_;
};

}  // namespace

std::vector<LayoutRules> detect_rules(const StateDict& dict, std::string_view model_type) {
  std::vector<LayoutRules> out = {builtin_rules("te")};
  std::optional<std::string> chosen;
  if (!model_type.empty()) chosen = rules_for_model_type(model_type);
  if (!chosen) {
    // Per-expert names: a set with renames when a key holds what they rename.
    std::string error;
    for (const char* name : {"hf-mixtral", "hf-w1w3", "hf"}) {
      const LayoutRules r = builtin_rules(name);
      const layout::KeyPattern p = *layout::KeyPattern::compile(r.tensors[0].parts[0], true, error);
      for (const auto& [key, t] : dict) {
        const bool renamed = r.renames.empty() || key.find(r.renames[0].first) != std::string::npos;
        if (renamed && p.match(key)) {
          chosen = name;
          break;
        }
      }
      if (chosen) break;
    }
  }
  if (!chosen) {
    // The fused form alone: its names do not tell the family, hf is the common one.
    std::string error;
    const layout::KeyPattern fused =
        *layout::KeyPattern::compile(builtin_rules("hf").tensors[0].stacked, false, error);
    for (const auto& [key, t] : dict) {
      if (t.rank() == 3 && fused.match(key)) {
        chosen = "hf";
        break;
      }
    }
  }
  if (chosen) out.push_back(builtin_rules(*chosen));
  return out;
}

GroupedScan scan_grouped_modules(const StateDict& dict, const std::vector<LayoutRules>& rules) {
  std::vector<LayoutRules> own;
  return layout::scan_modules(dict, or_detected(rules, dict, own, ""), !rules.empty()).scan;
}

std::vector<GroupedModule> find_grouped_modules(const StateDict& dict,
                                                const std::vector<LayoutRules>& rules) {
  GroupedScan scan = scan_grouped_modules(dict, rules);
  if (!scan.problems.empty()) throw scan.problems.front();
  return std::move(scan.modules);
}

uint64_t PlannedTensor::nbytes() const {
  uint64_t n = 0;
  for (const Tensor& p : pieces) n += p.nbytes();
  return n;
}

PlannedTensor PlannedTensor::of(std::string name, const Tensor& t) {
  return {std::move(name), t.dtype(), t.shape(), {t}};
}

void PlannedTensor::copy_to(Tensor& dst) const {
  if (shape_numel(shape) != dst.numel()) {
    throw Error(ErrorCode::ShapeMismatch, "copying planned tensor " + quote(name) + " " +
                                              shape_to_string(shape) + " into " +
                                              shape_to_string(dst.shape()));
  }
  Tensor flat = dst.reshape({dst.numel()});
  int64_t at = 0;
  for (const Tensor& piece : pieces) {
    flat.rows(at, piece.numel()).copy_from(piece);
    at += piece.numel();
  }
}

PlannedDict::PlannedDict(const StateDict& dict) {
  tensors_.reserve(dict.size());
  for (const auto& [name, t] : dict) {
    index_.emplace(name, tensors_.size());
    tensors_.push_back(PlannedTensor::of(name, t));
  }
}

PlannedDict::PlannedDict(std::vector<PlannedTensor> tensors) : tensors_(std::move(tensors)) {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (!index_.emplace(tensors_[i].name, i).second) {
      throw Error(ErrorCode::DuplicateName,
                  "planned tensors: " + quote(tensors_[i].name) + " is given twice");
    }
  }
}

const PlannedTensor* PlannedDict::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

PlannedTensor PlannedTensor::select(int64_t i) const {
  if (shape.empty() || i < 0 || i >= shape[0]) {
    throw Error(ErrorCode::OutOfBounds, "select(" + std::to_string(i) + ") on planned tensor " +
                                            quote(name) + " of shape " + shape_to_string(shape));
  }
  PlannedTensor out{name, dtype, Shape(shape.begin() + 1, shape.end()), {}};
  const int64_t slab = shape_numel(out.shape);
  int64_t begin = i * slab, left = slab;  // in elements, across the pieces
  for (const Tensor& piece : pieces) {
    if (left == 0) break;
    const int64_t n = piece.numel();
    if (begin >= n) {
      begin -= n;
      continue;
    }
    const int64_t take = std::min(left, n - begin);
    out.pieces.push_back(piece.reshape({n}).rows(begin, take));
    left -= take;
    begin = 0;
  }
  return out;
}

ConversionPlan plan_conversion(const StateDict& dict, ExpertLayout target,
                               const PlanOptions& options) {
  std::vector<LayoutRules> own;
  const std::vector<LayoutRules>& rules = or_detected(options.rules, dict, own, options.model_type);
  layout::ModuleScan ms = layout::scan_modules(dict, rules, !options.rules.empty());
  if (!ms.scan.problems.empty()) throw ms.scan.problems.front();
  if (!options.rules.empty()) {
    for (size_t s = 0; s < rules.size(); ++s) {
      if (!ms.matched[s]) {
        throw Error(ErrorCode::RuleMatchedNothing, "layout rules " + quote(rules[s].name) +
                                                       " match no entry of the checkpoint (no " +
                                                       quote(rules[s].tensors[0].stacked) +
                                                       " nor " +
                                                       quote(rules[s].tensors[0].parts[0]) + ")");
      }
    }
  }
  const bool sliced = options.experts.has_value();
  const int64_t begin = sliced ? options.experts->begin : 0;
  if (sliced && (begin < 0 || options.experts->end <= begin)) {
    throw Error(ErrorCode::OutOfBounds, "experts " + std::to_string(begin) + ":" +
                                            std::to_string(options.experts->end) +
                                            ": expected 0 <= begin < end");
  }
  ConversionPlan plan;
  plan.modules = ms.scan.modules;
  // Entry name -> module, and whether it is the module's first entry.
  std::unordered_map<std::string, std::pair<size_t, bool>> owner;
  for (size_t m = 0; m < plan.modules.size(); ++m) {
    const GroupedModule& g = plan.modules[m];
    if (sliced && options.experts->end > g.num_experts) {
      throw Error(ErrorCode::OutOfBounds, "experts " + std::to_string(begin) + ":" +
                                              std::to_string(options.experts->end) +
                                              " of grouped module " + quote(g.prefix) +
                                              ", which has " + std::to_string(g.num_experts));
    }
    for (size_t k = 0; k < g.keys.size(); ++k) owner.emplace(g.keys[k], std::pair(m, k == 0));
  }
  const bool to_single = target == ExpertLayout::Single;
  auto renamed_all = [&](const std::string& key) {
    std::string out = key;
    for (size_t s = 0; s < rules.size(); ++s) {
      if (ms.matched[s]) out = layout::renamed(out, rules[s], to_single);
    }
    return out;
  };
  for (const auto& [name, tensor] : dict) {
    auto it = owner.find(name);
    if (it == owner.end()) {
      plan.tensors.push_back(PlannedTensor::of(renamed_all(name), tensor));
      continue;
    }
    if (!it->second.second) continue;  // emitted with the module's first entry
    const size_t m = it->second.first;
    const GroupedModule& g = plan.modules[m];
    const layout::FoundModule& f = ms.found[m];
    const LayoutRules& r = rules[f.rules];
    bool as_is = !sliced;
    for (const ExpertTensor& t : g.tensors) as_is = as_is && t.layout == target;
    if (as_is) {  // in the module's own order
      for (const std::string& k : g.keys) {
        plan.tensors.push_back(PlannedTensor::of(layout::renamed(k, r, to_single), dict.at(k)));
      }
      continue;
    }
    const ModulePlanner planner(f, g, r, begin, sliced ? options.experts->end : g.num_experts);
    if (to_single) {
      planner.single(plan.tensors);
    } else {
      planner.per_expert(plan.tensors);
    }
  }
  return plan;
}

}  // namespace grouplin
