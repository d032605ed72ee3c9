// GroupedLinear's part of load_state_dict: a name match. The layout planner has already written
// the source in this module's form (layout/load_target.hpp: what it holds, load_target below),
// checked against its expert count and shapes, so every entry here is one of the module's own
// names: P.weight / P.weight{i}, P.bias / P.bias{i}, the FP8 scales P.weight_scale_inv /
// P.weight{i}_scale_inv, and _extra_state. The one thing left to the module is where its bytes
// go: a Single layout's stacked parameter also takes its experts one by one (a per-expert source,
// each expert copied straight into its slice).
#include "core/fp8.hpp"
#include "grouplin/grouped_linear.hpp"
#include "grouplin/load_state_dict.hpp"
#include "grouplin/module_extension.hpp"
#include "layout/expert_names.hpp"
#include "nn/load_target_of.hpp"

namespace grouplin {

layout::LoadTarget load_target(const GroupedLinear& g, const std::string& prefix) {
  const GroupedLinearOptions& o = g.options();
  return {prefix,     g.num_gemms(), o.out_features,  o.in_features,
          g.layout(), o.bias,        g.bias_layout(), o.params_dtype == DType::F8_E4M3};
}

namespace {

// One family of the module's entries (its weights, biases or FP8 scales): one stacked tensor
// (Single layout) or one per expert, named as the module's state_dict names them.
struct Entries {
  const std::string& prefix;
  const char* base;  // "weight" or "bias"
  bool scales;       // the FP8 scales of the weights: buffers, covered by the codes' report
  size_t first;      // parameter or buffer index of expert 0 (Single: of all)
  WeightLayout layout;

  std::string named(std::string key) const { return scales ? core::fp8_scale_name(key) : key; }
  std::string stacked_key() const { return named(prefix + base); }
  std::string expert_key(int64_t i) const { return named(layout::expert_key(prefix, base, i)); }
};

}  // namespace

void GroupedLinear::plan_load(const LoadSource& source, const std::string& prefix, LoadPlan& plan) {
  const int64_t n = num_gemms();
  auto copy = [&](const Entries& e, const std::string& key, const SourceTensor& src, size_t index,
                  int64_t expert) {
    plan.claim(key);
    if (e.scales) {
      plan.plan_buffer_copy(key, src, *this, index, expert);
    } else if (plan.options().assign && expert < 0 && e.layout != WeightLayout::Contiguous &&
               src.dtype() == parameters()[index].value.dtype()) {
      // Adopted only where this module holds the tensor whole (Contiguous views one block).
      plan.plan_adopt(key, src, *this, index);
    } else {
      plan.plan_copy(key, src, *this, index, expert);
    }
  };
  auto load = [&](const Entries& e) {
    if (e.layout == WeightLayout::Single) {
      if (const SourceTensor* src = source.find(e.stacked_key())) {
        return copy(e, e.stacked_key(), *src, e.first, -1);
      }
      std::vector<std::string> absent;
      for (int64_t i = 0; i < n; ++i) {
        const std::string key = e.expert_key(i);
        if (const SourceTensor* src = source.find(key)) {
          copy(e, key, *src, e.first, i);
        } else {
          absent.push_back(key);
        }
      }
      if (e.scales) return;
      if (absent.size() == static_cast<size_t>(n)) absent = {e.stacked_key()};
      for (const std::string& key : absent) plan.add_missing(key);
      return;
    }
    for (int64_t i = 0; i < n; ++i) {
      const std::string key = e.expert_key(i);
      if (const SourceTensor* src = source.find(key)) {
        copy(e, key, *src, e.first + static_cast<size_t>(i), -1);
      } else if (!e.scales) {
        plan.add_missing(key);
      }
    }
  };
  load({prefix, "weight", false, 0, layout_});
  if (options_.bias) load({prefix, "bias", false, first_bias_param(), bias_layout_});
  if (options_.params_dtype == DType::F8_E4M3) {
    load({prefix, "weight", true, scale_buffer(0), layout_});
  }

  // _extra_state loads like any module's buffer, and may be absent.
  const std::string extra_key = prefix + buffers()[0].first;
  if (const SourceTensor* src = source.find(extra_key)) {
    plan.claim(extra_key);
    plan.plan_buffer_copy(extra_key, *src, *this, 0);
  } else {
    plan.add_absent(extra_key);
  }
}

}  // namespace grouplin
