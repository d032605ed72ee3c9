// GroupedLinear's part of load_state_dict: accept per-expert or stacked entries whatever the
// module's own layout, check everything, and plan at most one copy of each byte.
#include <map>
#include <optional>

#include "grouplin/error.hpp"
#include "grouplin/grouped_linear.hpp"
#include "grouplin/load_state_dict.hpp"

namespace grouplin {
namespace {

// "weight12" -> 12 for base "weight"; nullopt for "weight", "weight_scale", "weight012".
std::optional<int64_t> expert_suffix(std::string_view local, std::string_view base) {
  if (local.size() <= base.size() || local.substr(0, base.size()) != base) return std::nullopt;
  std::string_view digits = local.substr(base.size());
  if (digits.size() > 18 || (digits.size() > 1 && digits[0] == '0')) return std::nullopt;
  int64_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

std::string join_indices(const std::vector<int64_t>& v, size_t limit = 16) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < limit; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  if (v.size() > limit) s += ", ... (" + std::to_string(v.size()) + " in all)";
  return s;
}

}  // namespace

void GroupedLinear::plan_load(const StateDict& source, const std::string& prefix, LoadPlan& plan) {
  const int64_t n = num_gemms();
  const bool single = layout_ == WeightLayout::Single;
  const bool assign = plan.options().assign;
  // The report names the root "" (load_state_dict.hpp); messages say "<root>".
  const std::string report_name = prefix.empty() ? "" : prefix.substr(0, prefix.size() - 1);
  const std::string module_name = prefix.empty() ? "<root>" : report_name;

  // Which per-expert entries does the source hold for this module? One pass over the keys.
  std::map<std::string, std::map<int64_t, const Tensor*>> per_expert;  // base -> index -> tensor
  for (const auto& [key, t] : source) {
    if (key.size() <= prefix.size() || key.compare(0, prefix.size(), prefix) != 0) continue;
    std::string_view local = std::string_view(key).substr(prefix.size());
    for (const char* base : {"weight", "bias"}) {
      if (auto i = expert_suffix(local, base)) per_expert[base][*i] = &t;
    }
  }

  // Plans one parameter family ("weight" or "bias"); returns the checkpoint layout seen.
  auto plan_family = [&](const std::string& base, const Shape& expert_shape,
                         std::optional<size_t> single_index, size_t first_index) {
    const std::string stacked_key = prefix + base;
    const Tensor* stacked = source.find(stacked_key);
    const auto& experts = per_expert[base];
    if (stacked != nullptr && !experts.empty()) {
      plan.add_problem(ErrorCode::BothLayoutsPresent,
                       "module " + quote(module_name) + ": both " + quote(stacked_key) + " and " +
                           std::to_string(experts.size()) + " per-expert \"" + prefix + base +
                           "{i}\" entries are present; expected one layout");
      plan.claim(stacked_key);
      for (const auto& [i, t] : experts) plan.claim(prefix + base + std::to_string(i));
      return;
    }
    if (stacked != nullptr) {
      plan.claim(stacked_key);
      Shape want = expert_shape;
      want.insert(want.begin(), n);
      if (stacked->rank() == want.size() && stacked->dim(0) != n) {
        plan.add_problem(ErrorCode::ExpertCountMismatch,
                         quote(stacked_key) + ": " + std::to_string(stacked->dim(0)) + " experts " +
                             shape_to_string(stacked->shape()) + ", module has " +
                             std::to_string(n) + " " + shape_to_string(want));
        return;
      }
      if (single) {
        if (assign && stacked->dtype() == options_.params_dtype) {
          plan.plan_adopt(stacked_key, *stacked, *this, *single_index);
        } else {
          plan.plan_copy(stacked_key, *stacked, *this, *single_index);
        }
        return;
      }
      if (stacked->shape() != want) {  // reported once, not once per expert
        plan.add_problem(ErrorCode::ShapeMismatch, quote(stacked_key) + ": shape " +
                                                       shape_to_string(stacked->shape()) +
                                                       ", expected " + shape_to_string(want));
        return;
      }
      // Each expert reads through a view of the source: no split copies.
      const bool adopt =
          assign && layout_ == WeightLayout::PerExpert && stacked->dtype() == options_.params_dtype;
      for (int64_t i = 0; i < n; ++i) {
        const size_t idx = first_index + static_cast<size_t>(i);
        const bool ok = adopt ? plan.plan_adopt(stacked_key, stacked->select(i), *this, idx)
                              : plan.plan_copy(stacked_key, stacked->select(i), *this, idx);
        if (!ok) return;  // every expert would fail alike (dtype): report the key once
      }
      if (base == "weight") {
        plan.add_layout_conversion({report_name, "stacked", std::string(layout_name(layout_))});
      }
      return;
    }
    if (experts.empty()) {
      if (single) {
        plan.add_missing(stacked_key);
      } else {
        for (int64_t i = 0; i < n; ++i) plan.add_missing(prefix + base + std::to_string(i));
      }
      return;
    }
    // Per-expert source.
    std::vector<int64_t> extra, absent;
    for (const auto& [i, t] : experts) {
      if (i >= n) extra.push_back(i);
    }
    for (int64_t i = 0; i < n; ++i) {
      if (experts.count(i) == 0) absent.push_back(i);
    }
    if (!extra.empty()) {
      plan.add_problem(ErrorCode::ExpertCountMismatch,
                       "module " + quote(module_name) + ": checkpoint has \"" + prefix + base +
                           std::to_string(extra.back()) + "\" but the module has " +
                           std::to_string(n) + " experts (" + base + "0.." + base +
                           std::to_string(n - 1) + ")");
      for (int64_t i : extra) plan.claim(prefix + base + std::to_string(i));
    }
    if (!absent.empty()) {
      // Strict: one PartialExpertSet problem naming the absent experts (not also one MissingKey
      // each, which would turn the code into LoadFailed). Otherwise they are reported missing.
      if (plan.options().strict) {
        plan.add_problem(ErrorCode::PartialExpertSet,
                         "module \"" + module_name +
                             "\": " + std::to_string(experts.size() - extra.size()) + " of " +
                             std::to_string(n) + " \"" + prefix + base +
                             "{i}\" entries present; missing experts " + join_indices(absent));
      } else {
        for (int64_t i : absent) plan.add_missing(prefix + base + std::to_string(i));
      }
    }
    for (const auto& [i, t] : experts) {
      if (i >= n) continue;
      const std::string key = prefix + base + std::to_string(i);
      plan.claim(key);
      if (single) {
        // Straight into the module's stacked storage: one copy, no stacked temporary.
        plan.plan_copy(key, *t, *this, *single_index, i);
      } else {
        const size_t idx = first_index + static_cast<size_t>(i);
        if (assign && layout_ == WeightLayout::PerExpert && t->dtype() == options_.params_dtype) {
          plan.plan_adopt(key, *t, *this, idx);
        } else {
          plan.plan_copy(key, *t, *this, idx);
        }
      }
    }
    if (single && base == "weight")
      plan.add_layout_conversion({report_name, "per-expert", "single"});
  };

  const Shape w_shape = {options_.out_features, options_.in_features};
  const Shape b_shape = {options_.out_features};
  plan_family("weight", w_shape, single ? std::optional<size_t>(0) : std::nullopt, 0);
  if (options_.bias) {
    plan_family("bias", b_shape, single ? std::optional<size_t>(1) : std::nullopt,
                static_cast<size_t>(n));
  }
  // Buffers (_extra_state) load like any module's.
  const std::string extra_key = prefix + buffers()[0].first;
  if (const Tensor* src = source.find(extra_key)) {
    plan.claim(extra_key);
    plan.plan_buffer_copy(extra_key, *src, *this, 0);
  } else {
    plan.add_missing(extra_key);
  }
}

}  // namespace grouplin
