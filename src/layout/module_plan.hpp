// Private: one grouped module written in a target layout, as planned tensors whose pieces are
// views of its entries (checkpoint_layout.cpp plans the whole dict around it).
#pragma once

#include <vector>

#include "grouplin/checkpoint_layout.hpp"
#include "layout/compiled_rules.hpp"
#include "layout/module_check.hpp"
#include "layout/plan.hpp"

namespace grouplin::layout {

// The layout one module takes for a plan's target, and how its keys are spelled.
struct ModuleTarget {
  ExpertLayout layout = ExpertLayout::Single;
  bool to_single_names = true;  // renames applied (else undone)
  bool drop_unit_dims = false;  // [N, 1, out] written as [N, out]
  bool keep = false;            // written as it is (Load: modules in GroupedLinear's names)
  bool dequantize = false;      // PlanOptions::dequantize
};

// Whether `r`'s renames apply toward the single spelling for `target`: always for a stacked-only
// family (its TE per-expert names are spelled like its single ones), else for Single and Load.
bool renames_to_single(const LayoutRules& r, Target target);

// What module `g` becomes for `target`. Throws Error(NoPerExpertForm) for a stacked-only
// family's module with target PerExpert unless `te_names`.
ModuleTarget module_target(const GroupedModule& g, Target target, bool te_names);

class ModulePlanner {
 public:
  // Experts [begin, end) of module `f` (`g` its report) of rule set `set`.
  ModulePlanner(const FoundModule& f, const GroupedModule& g, const CompiledRules& set,
                int64_t begin, int64_t end)
      : f_(f), g_(g), set_(set), begin_(begin), end_(end) {}

  // Appends the module's tensors in `target` layout to `out`: its entries as they are (renamed)
  // when nothing changes, else in the rule set's order.
  void emit(const ModuleTarget& target, bool sliced, const StateDict& dict,
            std::vector<PlannedTensor>& out) const;

 private:
  // Sets PlannedTensor::scale_of of the scales among out[first, ...): the name of the weight
  // each scales, as its rule declares (StackedTensorRule::scale_of).
  void link_scales(const ModuleTarget& target, bool as_is, std::vector<PlannedTensor>& out,
                   size_t first) const;
  // `dequantize`: ModuleTarget::dequantize.
  void single(std::vector<PlannedTensor>& out, bool dequantize) const;
  void per_expert(std::vector<PlannedTensor>& out) const;
  void expert_parts(size_t t, int64_t e, std::vector<PlannedTensor>& out) const;
  const ExpertTensor& tensor_info(size_t t) const;
  // Throws Error(ScaleBlocksUnaligned) if tensor t holds block scales of several parts that
  // cannot be concatenated or split (`into`: the layout asked for).
  void require_aligned_blocks(size_t t, ExpertLayout into) const;
  // The move between the stored form of tensor t and its per-expert form, if it is not a copy.
  std::optional<Rearrangement> rearrangement(size_t t, bool to_stored) const;

  const FoundModule& f_;
  const GroupedModule& g_;
  const CompiledRules& set_;
  int64_t begin_, end_;
};

}  // namespace grouplin::layout
