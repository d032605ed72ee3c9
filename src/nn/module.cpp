#include "grouplin/module.hpp"

#include <algorithm>
#include <unordered_map>

#include "grouplin/checkpoint_layout.hpp"
#include "grouplin/error.hpp"
#include "grouplin/load_state_dict.hpp"
#include "grouplin/module_extension.hpp"
#include "layout/dequantize_plan.hpp"
#include "layout/load_target.hpp"
#include "layout/plan.hpp"
#include "layout/renames.hpp"
#include "nn/load_target_of.hpp"

namespace grouplin {

void Module::add_child(std::string name, std::shared_ptr<Module> child) {
  if (name.empty() || name.find('.') != std::string::npos || !child) {
    throw Error(ErrorCode::InvalidArgument,
                "add_child: name " + quote(name) +
                    " must be non-empty without '.', and the child non-null");
  }
  for (const auto& [n, c] : children_) {
    if (n == name)
      throw Error(ErrorCode::DuplicateName, "add_child: child " + quote(name) + " exists");
  }
  children_.emplace_back(std::move(name), std::move(child));
}

Module& Module::child(std::string_view name) const {
  for (const auto& [n, c] : children_) {
    if (n == name) return *c;
  }
  throw Error(ErrorCode::MissingKey, "module has no child " + quote(std::string(name)));
}

const Parameter& Module::parameter(std::string_view dotted_name) const {
  const Module* m = this;
  std::string_view rest = dotted_name;
  for (size_t dot; (dot = rest.find('.')) != std::string_view::npos; rest = rest.substr(dot + 1)) {
    const Module* next = nullptr;
    for (const auto& [n, c] : m->children_) {
      if (n == rest.substr(0, dot)) next = c.get();
    }
    if (next == nullptr) break;
    m = next;
  }
  for (const Parameter& p : m->params_) {
    if (p.name == rest) return p;
  }
  throw Error(ErrorCode::MissingKey, "module has no parameter " + quote(std::string(dotted_name)));
}

void Module::for_each_parameter(const std::function<void(const std::string&, Parameter&)>& fn,
                                const std::string& prefix) {
  for (Parameter& p : params_) fn(prefix + p.name, p);
  for (auto& [name, c] : children_) c->for_each_parameter(fn, prefix + name + ".");
}

StateDict Module::state_dict(const std::string& prefix) const {
  StateDict sd;
  std::function<void(const Module&, const std::string&)> walk = [&](const Module& m,
                                                                    const std::string& pre) {
    for (const Parameter& p : m.params_) sd.insert(pre + p.name, p.value);
    for (const auto& [name, t] : m.buffers_) sd.insert(pre + name, t);
    for (const auto& [name, c] : m.children_) walk(*c, pre + name + ".");
  };
  walk(*this, prefix);
  return sd;
}

namespace {

// What the modules load from: the entries under the prefix (a broken module elsewhere in a
// whole-model dict is not this load's), through the same layout rules as convert and inspect, in
// the form GroupedLinear loads (layout::Target::Load), then fitted to the GroupedLinears of the
// tree (layout::fit_load_targets): each finds exactly its own names, checked against its expert
// count and shapes, and what fitting found goes into `plan`. A Hugging Face set's stacked tensor
// P.gate_up_proj becomes the weight of a GroupedLinear at P.gate_up_proj; a stacked-only family
// stored transposed arrives under TransformerEngine's per-expert names (P.gate_up_proj.weight{i}),
// already in [out, in].
PlannedDict source_for_load(const StateDict& dict, const LoadOptions& options,
                            const std::vector<layout::LoadTarget>& targets,
                            layout::LoadFindings& found) {
  const PlanOptions plan_options{options.rules, options.model_type, options.experts};
  const layout::ResolvedRules rules = layout::resolve(dict, plan_options);
  StateDict under;
  const StateDict* own = &dict;
  if (!options.prefix.empty()) {
    // An entry is under the prefix as spelled, or as its rules rename it (Mixtral's
    // "block_sparse_moe." loads into modules under "mlp.").
    for (const auto& [name, t] : dict) {
      bool in = name.starts_with(options.prefix);
      for (size_t r = 0; r < rules.sets.size() && !in; ++r) {
        in = layout::renamed(name, rules.sets[r].rules, true).starts_with(options.prefix);
      }
      if (in) under.insert(name, t);
    }
    own = &under;
  }
  ConversionPlan plan = layout::plan(*own, layout::Target::Load, plan_options, rules);
  std::unordered_map<std::string, std::string> renames;
  for (const GroupedModule& m : plan.modules) {
    if (m.grouped_linear_names) continue;
    for (const ExpertTensor& t : m.tensors) renames.emplace(t.name, t.name + ".weight");
  }
  std::unordered_map<std::string, std::string> renamed_from;
  for (PlannedTensor& t : plan.tensors) {
    if (auto it = renames.find(t.scale_of); it != renames.end()) t.scale_of = it->second;
    if (auto it = renames.find(t.name); it != renames.end() && t.scale_of.empty()) {
      renamed_from.emplace(it->second, t.name);
      t.name = it->second;
    }
  }
  // FP8 weights with their scales beside them load into a float module as their values (F32,
  // rounded once more only into a BF16 or F16 parameter: PyTorch's (q.float() * scale).to(dtype)).
  // Without scales they stay codes, which a float parameter refuses (Fp8ScalesNotApplied). An
  // FP8 module takes codes and scales as they are.
  std::vector<std::string> fp8_prefixes;
  for (const layout::LoadTarget& g : targets) {
    if (g.fp8) fp8_prefixes.push_back(g.prefix);
  }
  std::vector<PlannedTensor> as_codes, rest;
  for (PlannedTensor& t : plan.tensors) {
    const bool fp8_module =
        std::any_of(fp8_prefixes.begin(), fp8_prefixes.end(),
                    [&](const std::string& p) { return t.name.starts_with(p); });
    (fp8_module ? as_codes : rest).push_back(std::move(t));
  }
  layout::dequantize_plan(rest, DType::F32, layout::MissingScales::Keep);
  for (PlannedTensor& t : as_codes) rest.push_back(std::move(t));
  found = layout::fit_load_targets(rest, targets, options.strict);
  // Reports name what the source holds (a module list gathered into one stacked tensor: the
  // name transformers v5 gives it).
  for (auto& [key, origin] : found.origins) {
    if (auto it = renamed_from.find(origin); it != renamed_from.end()) origin = it->second;
  }
  for (const PlannedTensor& t : rest) {
    if (auto it = renamed_from.find(t.name); it != renamed_from.end()) {
      found.origins.emplace(t.name, it->second);
    }
  }
  return PlannedDict(std::move(rest));
}

}  // namespace

LoadReport Module::load_state_dict(const StateDict& dict, const LoadOptions& options) {
  if (!options.prefix.empty() && options.prefix.back() != '.') {
    throw Error(ErrorCode::InvalidArgument, "load_state_dict: prefix " + quote(options.prefix) +
                                                " must be empty or end in '.'");
  }
  // The GroupedLinears of the tree tell the planner what they hold.
  std::vector<layout::LoadTarget> targets;
  std::function<void(Module&, const std::string&)> find = [&](Module& m, const std::string& pre) {
    if (const auto* g = dynamic_cast<const GroupedLinear*>(&m)) {
      targets.push_back(load_target(*g, pre));
    }
    for (auto& [name, c] : m.children_) find(*c, pre + name + ".");
  };
  find(*this, options.prefix);
  layout::LoadFindings found;
  const PlannedDict planned = source_for_load(dict, options, targets, found);
  const LoadSource source(planned);
  LoadPlan plan(options);
  plan.problems_ = std::move(found.problems);
  for (LayoutConversion& c : found.conversions) plan.add_layout_conversion(std::move(c));
  plan.covered_.insert(found.covered.begin(), found.covered.end());
  plan.origins_ = std::move(found.origins);
  // Each module plans its own entries exactly once, whichever module the call starts at.
  std::function<void(Module&, const std::string&)> walk = [&](Module& m, const std::string& pre) {
    m.plan_load(source, pre, plan);
    for (auto& [name, c] : m.children_) walk(*c, pre + name + ".");
  };
  walk(*this, options.prefix);
  return plan.execute(source);
}

void Module::plan_load(const LoadSource& source, const std::string& prefix, LoadPlan& plan) {
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string key = prefix + params_[i].name;
    const SourceTensor* src = source.find(key);
    if (src == nullptr) {
      plan.add_missing(key);
      continue;
    }
    plan.claim(key);
    if (plan.options().assign && src->dtype() == params_[i].value.dtype()) {
      plan.plan_adopt(key, *src, *this, i);
    } else {
      plan.plan_copy(key, *src, *this, i);
    }
  }
  for (size_t i = 0; i < buffers_.size(); ++i) {
    const std::string key = prefix + buffers_[i].first;
    const SourceTensor* src = source.find(key);
    if (src == nullptr) {
      if (optional_buffers_[i]) {
        plan.add_absent(key);
      } else {
        plan.add_missing(key);
      }
      continue;
    }
    plan.claim(key);
    plan.plan_buffer_copy(key, *src, *this, i);
  }
}

size_t Module::register_parameter(std::string name, Tensor value) {
  params_.push_back(Parameter{std::move(name), std::move(value), {}, {}});
  return params_.size() - 1;
}

size_t Module::register_buffer(std::string name, Tensor value, bool optional) {
  buffers_.emplace_back(std::move(name), std::move(value));
  optional_buffers_.push_back(optional);
  return buffers_.size() - 1;
}

Tensor& writable_value(Parameter& p) {
  if (!p.value.writable()) p.value = p.value.clone();
  return p.value;
}

}  // namespace grouplin
