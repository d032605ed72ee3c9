// Grouped modules by layout rules, and conversion plans as lists of views (see
// include/grouplin/checkpoint_layout.hpp). The scan itself is layout/module_scan.cpp; the
// per-module planning layout/module_plan.cpp.
#include "grouplin/checkpoint_layout.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "layout/compiled_rules.hpp"
#include "layout/module_plan.hpp"
#include "layout/module_scan.hpp"
#include "layout/plan.hpp"
#include "layout/renames.hpp"

namespace grouplin {
namespace {

std::vector<layout::CompiledRules> compiled(const std::vector<LayoutRules>& rules) {
  std::vector<layout::CompiledRules> out;
  out.reserve(rules.size());
  for (const LayoutRules& r : rules) out.push_back(layout::compile_rules(r, r.name));
  return out;
}

bool any_key_matches(const StateDict& dict, const layout::KeyPattern& p, size_t rank = 0) {
  return std::any_of(dict.begin(), dict.end(), [&](const StateDict::Entry& e) {
    return (rank == 0 || e.second.rank() == rank) && p.match(e.first).has_value();
  });
}

// The Hugging Face structure whose per-expert names the keys use.
std::optional<std::string> structure_of_module_lists(const StateDict& dict) {
  for (const char* name : {"hf-mixtral", "hf-w1w3", "hf-fc", "hf", "hf-up-down"}) {
    const layout::CompiledRules& c = layout::compiled_builtin(name);
    const std::string* renamed_from = c.rules.renames.empty() ? nullptr : &c.rules.renames[0].first;
    const bool found = std::any_of(dict.begin(), dict.end(), [&](const StateDict::Entry& e) {
      return (renamed_from == nullptr || e.first.find(*renamed_from) != std::string::npos) &&
             c.parts[0][0].match(e.first).has_value();
    });
    if (found) return name;
  }
  return std::nullopt;
}

// The structure of stacked experts without a family to name it: shapes tell the orientation.
std::optional<std::string> structure_of_stacked(const StateDict& dict) {
  const layout::CompiledRules& gpt = layout::compiled_builtin("gpt-oss");
  if (any_key_matches(dict, gpt.stacked[1], 2)) return "gpt-oss";  // gate_up_proj_bias [N, 2I]
  std::optional<std::string> first_match;
  for (const char* name : {"hf", "stacked-transposed", "hf-up-down"}) {
    const std::vector<layout::CompiledRules> one = {layout::compiled_builtin(name)};
    if (!any_key_matches(dict, one[0].stacked[0], 3)) continue;
    const layout::ModuleScan s = layout::scan_modules(dict, one, false);
    if (!s.scan.modules.empty() && s.scan.problems.empty()) return name;
    if (!first_match) first_match = name;
  }
  return first_match;
}

// The names of the built-in sets that fit `dict` (detect_rules).
std::vector<std::string> detected_names(const StateDict& dict, std::string_view model_type) {
  if (std::optional<std::string> family = rules_for_model_type(model_type)) return {*family};
  std::vector<std::string> out = {"te"};
  std::optional<std::string> chosen = structure_of_module_lists(dict);
  if (!chosen) chosen = structure_of_stacked(dict);
  if (chosen) out.push_back(*chosen);
  return out;
}

}  // namespace

std::vector<LayoutRules> detect_rules(const StateDict& dict, std::string_view model_type) {
  std::vector<LayoutRules> out;
  for (const std::string& name : detected_names(dict, model_type)) {
    out.push_back(builtin_rules(name));
  }
  return out;
}

GroupedScan scan_grouped_modules(const StateDict& dict, const std::vector<LayoutRules>& rules) {
  return layout::scan(dict, {rules, "", std::nullopt});
}

std::vector<GroupedModule> find_grouped_modules(const StateDict& dict,
                                                const std::vector<LayoutRules>& rules) {
  GroupedScan scan = scan_grouped_modules(dict, rules);
  if (!scan.problems.empty()) throw scan.problems.front();
  return std::move(scan.modules);
}

ConversionPlan plan_conversion(const StateDict& dict, ExpertLayout target,
                               const PlanOptions& options) {
  return layout::plan(
      dict, target == ExpertLayout::Single ? layout::Target::Single : layout::Target::PerExpert,
      options);
}

namespace layout {

ResolvedRules resolve(const StateDict& dict, const PlanOptions& o) {
  ResolvedRules out;
  if (o.rules.empty()) {
    for (const std::string& name : detected_names(dict, o.model_type)) {
      out.sets.push_back(compiled_builtin(name));
    }
    return out;
  }
  out.explicit_rules = true;
  std::vector<LayoutRules> rules = o.rules;
  auto names_sets = [](const LayoutRules& r) { return r.grouped_linear_names; };
  auto stacked_only = [](const LayoutRules& r) { return r.per_expert == PerExpertForm::TeOnly; };
  out.te_names = std::any_of(rules.begin(), rules.end(), names_sets);
  if (out.te_names && std::none_of(rules.begin(), rules.end(), stacked_only)) {
    // te alone for a stacked-only family named by config.json: that family, under TE names.
    if (std::optional<std::string> f = rules_for_model_type(o.model_type)) {
      LayoutRules family = builtin_rules(*f);
      if (stacked_only(family)) rules.push_back(std::move(family));
    }
  }
  if (out.te_names && std::any_of(rules.begin(), rules.end(), stacked_only)) {
    // Then te asks for names; it is not a set of its own.
    rules.erase(std::remove_if(rules.begin(), rules.end(), names_sets), rules.end());
  }
  out.sets = compiled(rules);
  return out;
}

GroupedScan scan(const StateDict& dict, const PlanOptions& options) {
  const ResolvedRules rules = resolve(dict, options);
  return scan_modules(dict, rules.sets, rules.explicit_rules, options.declared_modules).scan;
}

// Whether detected rules would miss module `f` written for `target` without a declaration: its
// first tensor stacked and alone, its set's stacked_needs entry not in the dict (which passes
// through to the output as it is).
bool needs_declaration(const FoundModule& f, const CompiledRules& set, const ModuleTarget& target,
                       const StateDict& dict) {
  if (!set.stacked_needs || target.layout != ExpertLayout::Single || target.keep) return false;
  const bool alone = std::none_of(f.tensors.begin() + 1, f.tensors.end(),
                                  [](const FoundTensor& t) { return t.present; });
  return alone && !dict.contains(set.stacked_needs->format(f.canonical));
}

// A conversion that found no module but stacked tensors it could not tell from convolutions
// would change nothing: never a silent no-op.
[[noreturn]] void refuse_unconfirmed(const StateDict& dict, const GroupedScan& scan) {
  const UnconfirmedStack& u = scan.unconfirmed.front();
  const size_t more = scan.unconfirmed.size() - 1;
  throw Error(ErrorCode::NoGroupedModules,
              "no grouped module found: " + quote(u.name) + " " +
                  shape_to_string(dict.at(u.name).shape()) +
                  (more ? " (and " + std::to_string(more) + " more)" : "") + " is " + u.reason());
}

// A family transformers knows but GroupLin cannot convert exactly has no per-expert form to
// write: leaving its experts as they are would not be what was asked for.
void refuse_unsupported_family(std::string_view model_type, Target target) {
  for (const ModelFamily& f : model_families()) {
    if (f.model_type != model_type || !f.structure.empty()) continue;
    const bool per_expert = target == Target::PerExpert;
    throw Error(per_expert ? ErrorCode::NoPerExpertForm : ErrorCode::NoGroupedModules,
                "model type " + quote(model_type) +
                    " (config.json): GroupLin has no rules for this family's experts (" +
                    f.not_applied + "), so " +
                    (per_expert ? "no per-expert form to write" : "no grouped module to convert"));
  }
}

ConversionPlan plan(const StateDict& dict, Target target, const PlanOptions& options) {
  return plan(dict, target, options, resolve(dict, options));
}

ConversionPlan plan(const StateDict& dict, Target target, const PlanOptions& options,
                    const ResolvedRules& rules) {
  if (target == Target::PerExpert && options.rules.empty()) {
    refuse_unsupported_family(options.model_type, target);
  }
  ModuleScan ms = scan_modules(dict, rules.sets, rules.explicit_rules, options.declared_modules);
  for (size_t i = 0; i < ms.scan.problems.size(); ++i) {
    // A broken candidate already named as GroupedLinear loads (te's names) is left as it is for
    // Load: fit_load_targets checks it against the expert count of the module it loads into (a
    // partial set of a non-strict load then loads the experts it has).
    const size_t s = ms.problem_sets[i];
    const bool loads_as_named =
        target == Target::Load && s < rules.sets.size() && rules.sets[s].rules.grouped_linear_names;
    if (!loads_as_named) throw ms.scan.problems[i];
  }
  if ((target == Target::Single || target == Target::PerExpert) && ms.scan.modules.empty() &&
      !ms.scan.unconfirmed.empty()) {
    // A family known to have no rules says so before what detection could not confirm.
    if (options.rules.empty()) refuse_unsupported_family(options.model_type, target);
    refuse_unconfirmed(dict, ms.scan);
  }
  if (rules.explicit_rules) {
    for (size_t s = 0; s < rules.sets.size(); ++s) {
      if (ms.matched[s]) continue;
      const LayoutRules& r = rules.sets[s].rules;
      throw Error(ErrorCode::RuleMatchedNothing,
                  "layout rules " + quote(r.name) + " match no entry of the checkpoint (no " +
                      quote(r.tensors[0].stacked) + " nor " + quote(r.tensors[0].parts[0]) + ")");
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
  plan.unconfirmed = ms.scan.unconfirmed;
  // Entry name -> module, and whether it is the module's first entry.
  std::unordered_map<std::string, std::pair<size_t, bool>> owner;
  std::vector<ModuleTarget> targets;
  for (size_t m = 0; m < plan.modules.size(); ++m) {
    const GroupedModule& g = plan.modules[m];
    if (sliced && options.experts->end > g.num_experts) {
      throw Error(ErrorCode::OutOfBounds, "experts " + std::to_string(begin) + ":" +
                                              std::to_string(options.experts->end) +
                                              " of grouped module " + quote(g.prefix) +
                                              ", which has " + std::to_string(g.num_experts));
    }
    targets.push_back(module_target(g, target, rules.te_names));
    targets.back().dequantize = options.dequantize;
    if (needs_declaration(ms.found[m], rules.sets[ms.found[m].rules], targets.back(), dict)) {
      plan.to_declare.push_back(ms.found[m].canonical);
    }
    for (size_t k = 0; k < g.keys.size(); ++k) owner.emplace(g.keys[k], std::pair(m, k == 0));
  }
  // Entries of no module take each matched set's renames, in the direction of its modules.
  auto renamed_all = [&](const std::string& key) {
    std::string out = key;
    for (size_t s = 0; s < rules.sets.size(); ++s) {
      const LayoutRules& r = rules.sets[s].rules;
      if (ms.matched[s]) out = renamed(out, r, renames_to_single(r, target));
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
    const FoundModule& f = ms.found[m];
    const ModulePlanner planner(f, plan.modules[m], rules.sets[f.rules], begin,
                                sliced ? options.experts->end : plan.modules[m].num_experts);
    planner.emit(targets[m], sliced, dict, plan.tensors);
  }
  return plan;
}

}  // namespace layout

std::string UnconfirmedStack::reason() const {
  return "named as the stacked weight of rules " + quote(rules) + ", but without " + quote(needs) +
         ", a stacked bias or scales beside it, nor a declaration in safetensors metadata (" +
         kDeclaredModulesKey +
         "), it may be a convolution; if it holds experts, ask for the rules by name (--rules " +
         rules + ")";
}

std::vector<std::string> declared_modules(const std::map<std::string, std::string>& metadata,
                                          const std::string& source) {
  auto it = metadata.find(kDeclaredModulesKey);
  if (it == metadata.end()) return {};
  const nlohmann::json j = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  bool ok = j.is_array();
  for (size_t i = 0; ok && i < j.size(); ++i) ok = j[i].is_string();
  if (!ok) {
    throw Error(ErrorCode::InvalidMetadata,
                source + ": metadata entry " + quote(kDeclaredModulesKey) +
                    " should be a JSON array of module prefixes (strings); found " +
                    quote(it->second.substr(0, 80)) + (it->second.size() > 80 ? "..." : ""));
  }
  return j.get<std::vector<std::string>>();
}

std::map<std::string, std::string> with_declared_modules(
    std::map<std::string, std::string> metadata, const std::vector<std::string>& prefixes) {
  metadata.erase(kDeclaredModulesKey);
  if (!prefixes.empty()) metadata.emplace(kDeclaredModulesKey, nlohmann::json(prefixes).dump());
  return metadata;
}

uint64_t PlannedTensor::nbytes() const {
  if (dequantize) return static_cast<uint64_t>(shape_numel(shape)) * dtype_size(dtype);
  uint64_t n = 0;
  for (const Tensor& p : pieces) n += p.nbytes();
  return n;
}

PlannedTensor PlannedTensor::of(std::string name, const Tensor& t) {
  return {std::move(name), t.dtype(), t.shape(), {t}};
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

}  // namespace grouplin
