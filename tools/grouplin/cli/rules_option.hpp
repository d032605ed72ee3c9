// The --rules and --experts options that inspect, convert and verify share.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "grouplin/checkpoint_layout.hpp"
#include "grouplin/layout_rules.hpp"

namespace grouplin::cli {

// What --rules VALUE names: "" or "auto" -> {} (detected from the checkpoint); a comma-separated
// list of built-in sets (the structures "te", "hf", ... and the model types `grouplin rules`
// lists) and rule files (a value that is not a built-in name is a path). Throws
// Error(InvalidArgument) for an empty list item, and load_rules' errors (IoError, InvalidRules).
std::vector<LayoutRules> rules_from_option(const std::string& value);

// What --experts B:E names: experts [B, E). Throws Error(InvalidArgument) naming the value
// unless it is two decimal integers with 0 <= B < E.
ExpertRange experts_from_option(const std::string& value);

// The help text of --state-dict.
inline constexpr const char* kStateDictHelp =
    "of a .pt training checkpoint holding several dicts of tensors (Megatron's model0, model1, "
    "...): the top-level key of the one to read (default: the only one)";

// The help text of --rules.
inline constexpr const char* kRulesHelp =
    "how grouped modules are named: auto (default: config.json's model_type, else the names), "
    "a built-in set (te, hf, hf-mixtral, ..., or a model type: `grouplin rules` lists them), a "
    "rules file (docs/rules.md), or a comma-separated list of these; te beside (or, with "
    "config.json, instead of) a stacked-only family asks for TransformerEngine per-expert names";

}  // namespace grouplin::cli
