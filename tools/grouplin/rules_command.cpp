// grouplin rules [NAME] [--json]: the built-in layout rules. Without NAME, the structures and
// every model family (its structure, its renames, what of transformers' mapping is not applied);
// with NAME (a structure or a model type), that rule set in the JSON form of docs/rules.md, which
// --rules reads back from a file.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.hpp"
#include "grouplin/error.hpp"
#include "grouplin/layout_rules.hpp"

namespace grouplin::cli {
namespace {

// The transformers release whose conversion mapping model_families() was checked against
// (bench/hf_rules_table.py).
constexpr const char* kTransformersChecked = "5.25.0";

struct RulesConfig {
  std::string name;
  bool json = false;
};

nlohmann::ordered_json renames_json(const std::vector<std::pair<std::string, std::string>>& r) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& [from, to] : r) out.push_back({{"from", from}, {"to", to}});
  return out;
}

nlohmann::ordered_json joins_json(const std::vector<JoinedTensors>& joins) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const JoinedTensors& j : joins) {
    nlohmann::ordered_json e = {{"whole", j.whole}, {"parts", j.parts}};
    if (j.transposed) e["transposed"] = true;
    out.push_back(e);
  }
  return out;
}

void print_all_json() {
  nlohmann::ordered_json doc;
  doc["transformers_checked"] = kTransformersChecked;
  doc["structures"] = nlohmann::ordered_json::array();
  for (const std::string& n : builtin_rule_names()) {
    if (rules_for_model_type(n)) continue;  // the families follow
    doc["structures"].push_back(nlohmann::ordered_json::parse(rules_to_json(builtin_rules(n))));
  }
  doc["families"] = nlohmann::ordered_json::array();
  for (const ModelFamily& f : model_families()) {
    doc["families"].push_back(
        {{"model_type", f.model_type},
         {"structure", f.structure.empty() ? nlohmann::ordered_json(nullptr)
                                           : nlohmann::ordered_json(f.structure)},
         {"renames", renames_json(f.renames)},
         {"renames_after", f.renames_after},
         {"joins", joins_json(f.joins)},
         {"not_applied", f.not_applied}});
  }
  std::cout << doc.dump(2) << "\n";
}

void print_all_text() {
  std::printf("structures:");
  for (const std::string& n : builtin_rule_names()) {
    if (!rules_for_model_type(n)) std::printf(" %s", n.c_str());
  }
  std::printf("\nmodel families (transformers %s; `grouplin rules TYPE` prints one):\n",
              kTransformersChecked);
  size_t width = 10;
  for (const ModelFamily& f : model_families()) width = std::max(width, f.model_type.size());
  for (const ModelFamily& f : model_families()) {
    std::printf("  %-*s  %-18s", static_cast<int>(width), f.model_type.c_str(),
                f.structure.empty() ? "(none)" : f.structure.c_str());
    if (!f.renames.empty()) std::printf("  %zu rename(s)", f.renames.size());
    if (!f.not_applied.empty()) {
      std::printf("  %s %s",
                  f.structure.empty() ? "unsupported:" : "not applied:", f.not_applied.c_str());
    }
    if (!f.joins.empty()) std::printf(" (verify joins them)");
    std::printf("\n");
  }
}

void run_rules(const RulesConfig& c) {
  if (c.name.empty()) {
    if (c.json) {
      print_all_json();
    } else {
      print_all_text();
    }
    return;
  }
  std::cout << rules_to_json(builtin_rules(c.name)) << "\n";
}

}  // namespace

void add_rules_command(CLI::App& app) {
  auto config = std::make_shared<RulesConfig>();
  CLI::App* cmd = app.add_subcommand(
      "rules",
      "List the built-in layout rules: the structures and every MoE model family of "
      "transformers, or print one rule set as JSON");
  cmd->add_option(
      "NAME", config->name,
      "a structure (te, hf, hf-mixtral, ...) or a model type (qwen3_moe, gpt_oss, ...)");
  cmd->add_flag("--json", config->json, "without NAME: everything as one JSON document");
  cmd->footer(
      "A family is a structure (how its experts are named and stored) plus its renames, chosen\n"
      "by config.json's model_type; docs/rules.md explains the fields. Exit: 0; 2 for an unknown\n"
      "name.\n\n"
      "Examples:\n"
      "  grouplin rules\n"
      "  grouplin rules gpt_oss\n"
      "  grouplin rules mixtral > my-rules.json   # edit, then: grouplin convert ... --rules "
      "my-rules.json");
  cmd->callback([config] { run_rules(*config); });
}

}  // namespace grouplin::cli
