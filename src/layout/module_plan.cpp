// One grouped module in a target layout (layout/module_plan.hpp).
#include "layout/module_plan.hpp"

#include <algorithm>
#include <unordered_map>

#include "layout/planned_tensor.hpp"
#include "layout/renames.hpp"

namespace grouplin::layout {

bool renames_to_single(const LayoutRules& r, Target target) {
  return r.per_expert == PerExpertForm::TeOnly || target == Target::Single ||
         target == Target::Load;
}

ModuleTarget module_target(const GroupedModule& g, Target target, bool te_names) {
  ModuleTarget m;
  const bool rearranged = std::any_of(
      g.tensors.begin(), g.tensors.end(),
      [](const ExpertTensor& t) { return t.transposed || t.interleave > 1 || t.folded; });
  switch (target) {
    case Target::Single:
      m.layout = ExpertLayout::Single;
      break;
    case Target::PerExpert:
      if (g.stacked_only && !te_names) {
        throw Error(ErrorCode::NoPerExpertForm,
                    module_name(g.prefix) + " (" + g.rules +
                        "): this family stores its experts stacked only and has no per-expert "
                        "names of its own; per-expert output takes TransformerEngine's names (" +
                        g.tensors.front().name +
                        ".weight{i} [out, in]) only when asked for with "
                        "the te rules (--rules te)");
      }
      m.layout = ExpertLayout::PerExpert;
      break;
    case Target::Compare:
      m.layout = g.stacked_only ? ExpertLayout::Single : ExpertLayout::PerExpert;
      break;
    case Target::Load:
      m.layout = g.stacked_only && rearranged ? ExpertLayout::PerExpert : ExpertLayout::Single;
      m.drop_unit_dims = true;
      m.keep = g.grouped_linear_names;  // GroupedLinear's names already: fit_load_targets fits them
      break;
  }
  m.to_single_names = g.stacked_only || m.layout == ExpertLayout::Single;
  return m;
}

void ModulePlanner::emit(const ModuleTarget& target, bool sliced, const StateDict& dict,
                         std::vector<PlannedTensor>& out) const {
  bool as_is = !sliced;
  for (size_t t = 0; t < f_.tensors.size(); ++t) {
    const FoundTensor& ft = f_.tensors[t];
    if (!ft.present) continue;
    const ExpertLayout layout = ft.stacked ? ExpertLayout::Single : ExpertLayout::PerExpert;
    as_is = as_is &&
            (target.keep || (layout == target.layout && !(ft.unit_dim && target.drop_unit_dims)));
  }
  const size_t first = out.size();
  if (as_is) {  // in the module's own order
    for (const std::string& k : g_.keys) {
      out.push_back(PlannedTensor::of(renamed(k, set_.rules, target.to_single_names), dict.at(k)));
    }
  } else if (target.layout == ExpertLayout::Single) {
    single(out, target.dequantize);
  } else {
    per_expert(out);
  }
  link_scales(target, as_is, out, first);
}

void ModulePlanner::link_scales(const ModuleTarget& target, bool as_is,
                                std::vector<PlannedTensor>& out, size_t first) const {
  // Output name of each scale -> output name of the weight it scales, as emitted above.
  std::unordered_map<std::string, std::string> weight_of;
  auto name = [&](const std::string& key) {
    return renamed(key, set_.rules, target.to_single_names);
  };
  for (size_t t = 0; t < f_.tensors.size(); ++t) {
    if (set_.scale_of[t] < 0 || !f_.tensors[t].present) continue;
    const auto w = static_cast<size_t>(set_.scale_of[t]);
    const FoundTensor &s = f_.tensors[t], &wt = f_.tensors[w];
    if (as_is) {
      if (s.stacked && wt.stacked)
        weight_of.emplace(name(s.stacked->first), name(wt.stacked->first));
      if (s.stacked || wt.stacked) continue;  // mixed layouts: no entry scales one entry
      for (size_t p = 0; p < s.parts.size() && p < wt.parts.size(); ++p) {
        for (const auto& [e, entry] : s.parts[p]) {
          auto it = wt.parts[p].find(e);
          if (it != wt.parts[p].end())
            weight_of.emplace(name(entry->first), name(it->second->first));
        }
      }
    } else if (target.layout == ExpertLayout::Single) {
      weight_of.emplace(set_.stacked[t].format(f_.canonical), set_.stacked[w].format(f_.canonical));
    } else {
      for (int64_t e = begin_; e < end_; ++e) {
        for (size_t p = 0; p < set_.parts[t].size() && p < set_.parts[w].size(); ++p) {
          weight_of.emplace(set_.parts[t][p].format(f_.spelled, e - begin_),
                            set_.parts[w][p].format(f_.spelled, e - begin_));
        }
      }
    }
  }
  for (size_t i = first; i < out.size(); ++i) {
    if (auto it = weight_of.find(out[i].name); it != weight_of.end()) out[i].scale_of = it->second;
  }
}

const ExpertTensor& ModulePlanner::tensor_info(size_t t) const {
  size_t k = 0;  // g_.tensors holds only the present tensors
  for (size_t i = 0; i < t; ++i) k += f_.tensors[i].present;
  return g_.tensors[k];
}

std::optional<Rearrangement> ModulePlanner::rearrangement(size_t t, bool to_stored) const {
  const StackedTensorRule& rule = set_.rules.tensors[t];
  if (!rule.transposed && rule.interleave <= 1) return std::nullopt;
  const Shape& e = f_.tensors[t].part_shape;  // one part (the only one) of one expert
  Rearrangement r;
  r.rows = e[0];
  r.cols = e.size() > 1 ? e[1] : 1;
  const MatrixForm stored{rule.transposed, rule.interleave};
  (to_stored ? r.to : r.from) = stored;
  return r;
}

void ModulePlanner::require_aligned_blocks(size_t t, ExpertLayout into) const {
  const FoundTensor& ft = f_.tensors[t];
  if (ft.blocks_aligned) return;
  const ExpertTensor& et = tensor_info(t);
  const auto w = static_cast<size_t>(set_.scale_of[t]);
  std::string rows;
  for (size_t p = 0; p < f_.tensors[w].part_rows.size(); ++p) {
    rows += (p ? " + " : "") + std::to_string(f_.tensors[w].part_rows[p]);
  }
  throw Error(ErrorCode::ScaleBlocksUnaligned,
              module_name(g_.prefix) + ": the " + std::to_string(et.block[0]) + " x " +
                  std::to_string(et.block[1]) + " block scales " + quote(et.name) + " of " +
                  quote(et.scale_of) + " (rows " + rows + " per expert) cannot be " +
                  (into == ExpertLayout::Single ? "concatenated" : "split") +
                  " exactly: a part other than the last does not end on a block boundary, so a "
                  "block would straddle two parts; the " +
                  (into == ExpertLayout::Single ? "per-expert" : "single") +
                  " layout it has is the only exact one");
}

void ModulePlanner::single(std::vector<PlannedTensor>& out, bool dequantize) const {
  for (size_t t = 0; t < f_.tensors.size(); ++t) {
    const FoundTensor& ft = f_.tensors[t];
    if (!ft.present) continue;
    const ExpertTensor& et = tensor_info(t);
    PlannedTensor p{set_.stacked[t].format(f_.canonical), et.dtype, et.expert_shape, {}};
    if (ft.stacked == nullptr && !ft.blocks_aligned) {
      // Scales dropped by dequantization may be concatenated part by part: each part's codes
      // are dequantized by its own scales (equal parts only: one matrix shape).
      const std::vector<int64_t>& rows =
          f_.tensors[static_cast<size_t>(set_.scale_of[t])].part_rows;
      const bool equal =
          std::all_of(rows.begin(), rows.end(), [&](int64_t r) { return r == rows[0]; });
      if (!dequantize || !equal) require_aligned_blocks(t, ExpertLayout::Single);
      p.part_rows = rows[0];
    }
    if (et.transposed) std::swap(p.shape[0], p.shape[1]);  // stored [in, out]
    const int64_t rows = p.shape[0];                       // stored rows of one expert
    if (et.folded) {
      p.shape[0] *= end_ - begin_;
    } else {
      p.shape.insert(p.shape.begin(), end_ - begin_);
    }
    if (ft.stacked != nullptr) {
      p.pieces.push_back(et.folded ? ft.stacked->second.rows(begin_ * rows, (end_ - begin_) * rows)
                                   : ft.stacked->second.rows(begin_, end_ - begin_));
    } else {
      for (int64_t e = begin_; e < end_; ++e) {
        for (const auto& part : ft.parts) p.pieces.push_back(part.at(e)->second);
      }
      p.rearrange = rearrangement(t, /*to_stored=*/true);
    }
    out.push_back(std::move(p));
  }
}

void ModulePlanner::per_expert(std::vector<PlannedTensor>& out) const {
  if (set_.rules.expert_major) {
    for (int64_t e = begin_; e < end_; ++e) {
      for (size_t t = 0; t < f_.tensors.size(); ++t) expert_parts(t, e, out);
    }
  } else {
    for (size_t t = 0; t < f_.tensors.size(); ++t) {
      for (int64_t e = begin_; e < end_; ++e) expert_parts(t, e, out);
    }
  }
}

void ModulePlanner::expert_parts(size_t t, int64_t e, std::vector<PlannedTensor>& out) const {
  const FoundTensor& ft = f_.tensors[t];
  if (!ft.present) return;
  const std::vector<KeyPattern>& parts = set_.parts[t];
  if (ft.stacked == nullptr) {
    for (size_t p = 0; p < parts.size(); ++p) {
      out.push_back(
          PlannedTensor::of(parts[p].format(f_.spelled, e - begin_), ft.parts[p].at(e)->second));
    }
    return;
  }
  require_aligned_blocks(t, ExpertLayout::PerExpert);
  Tensor slice = ft.folded_rows > 0 ? ft.stacked->second.rows(e * ft.folded_rows, ft.folded_rows)
                                    : ft.stacked->second.select(e);
  if (ft.unit_dim) slice = slice.select(0);
  if (parts.size() == 1 && !set_.rules.tensors[t].transposed &&
      set_.rules.tensors[t].interleave <= 1) {
    // The whole slice (a one-per-expert scale may have no rows to cut).
    out.push_back(PlannedTensor::of(parts[0].format(f_.spelled, e - begin_), slice));
    return;
  }
  if (std::optional<Rearrangement> r = rearrangement(t, /*to_stored=*/false)) {
    // One part, stored transposed or interleaved: the whole slice, moved into [out, in].
    PlannedTensor p{parts[0].format(f_.spelled, e - begin_), slice.dtype(), ft.part_shape, {slice}};
    p.rearrange = r;
    out.push_back(std::move(p));
    return;
  }
  int64_t row = 0;
  for (size_t p = 0; p < parts.size(); ++p) {
    out.push_back(PlannedTensor::of(parts[p].format(f_.spelled, e - begin_),
                                    slice.rows(row, ft.part_rows[p])));
    row += ft.part_rows[p];
  }
}

}  // namespace grouplin::layout
