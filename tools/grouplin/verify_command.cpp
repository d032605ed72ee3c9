// grouplin verify A B: exit 0 when A and B hold the same values modulo layout and format, 1 when
// they differ (the first differences are printed), 2 on an error.
#include <cstdio>
#include <iostream>
#include <string>

#include "cli/commands.hpp"
#include "cli/progress.hpp"
#include "cli/rules_option.hpp"
#include "grouplin/compare.hpp"

namespace grouplin::cli {
namespace {

struct VerifyConfig {
  std::string a;
  std::string b;
  size_t max_listed = 10;
  std::string rules;
  std::string state_dict;
  bool json = false;
};

std::string describe(CheckpointFormat format, size_t shards,
                     const std::vector<GroupedModule>& modules) {
  std::string s(format_name(format));
  if (shards > 0) s += " directory of " + std::to_string(shards) + " shard(s)";
  size_t single = 0;
  for (const GroupedModule& m : modules) single += m.layout == ExpertLayout::Single;
  s += ", " + std::to_string(modules.size()) + " grouped module(s)";
  if (!modules.empty()) {
    s += " (" + std::to_string(modules.size() - single) + " per-expert, " + std::to_string(single) +
         " single)";
  }
  return s;
}

void run_verify(const VerifyConfig& c) {
  CompareOptions o;
  o.max_listed = c.max_listed;
  o.rules = rules_from_option(c.rules);
  o.state_dict_key = c.state_dict;
  ProgressBar bar("verifying", c.json);
  o.progress = [&bar](uint64_t done, uint64_t total) { bar.update(done, total); };
  CompareReport r;
  try {
    r = compare_checkpoints(c.a, c.b, o);
  } catch (const Error& e) {
    if (c.json) std::cout << error_json(e, {{"a", c.a}, {"b", c.b}}) << "\n";
    throw;
  }
  bar.finish();
  print_warnings(r.warnings);
  if (c.json) {
    std::cout << compare_report_json(r, c.a, c.b) << "\n";
    if (!r.same) g_exit_code = 1;
    return;
  }
  std::printf("A: %s: %s\nB: %s: %s\n", escaped(c.a).c_str(),
              describe(r.format_a, r.shards_a, r.modules_a).c_str(), escaped(c.b).c_str(),
              describe(r.format_b, r.shards_b, r.modules_b).c_str());
  if (r.same) {
    std::printf("same: %zu tensors, %s of values, bit for bit\n", r.tensors_compared,
                format_bytes(r.bytes_compared).c_str());
    return;
  }
  std::printf("different: %zu entr%s differ\n", r.differing, r.differing == 1 ? "y" : "ies");
  for (const std::string& line : r.differences) std::printf("  %s\n", line.c_str());
  if (r.differing > r.differences.size()) {
    std::printf("  ... and %zu more\n", r.differing - r.differences.size());
  }
  g_exit_code = 1;
}

}  // namespace

void add_verify_command(CLI::App& app) {
  auto c = std::make_shared<VerifyConfig>();
  CLI::App* cmd = app.add_subcommand(
      "verify",
      "Check that two checkpoints hold the same values, whatever their layouts and "
      "formats (entry names, dtypes, shapes and bits)");
  cmd->add_option("A", c->a, "first checkpoint (a file or a directory of shards)")->required();
  cmd->add_option("B", c->b, "second checkpoint (a file or a directory of shards)")->required();
  cmd->add_option("--max-listed", c->max_listed, "differences to print (default 10)")
      ->check(CLI::Range(0, 1000000));
  cmd->add_option("--rules", c->rules, kRulesHelp);
  cmd->add_option("--state-dict", c->state_dict, kStateDictHelp);
  cmd->add_flag("--json", c->json,
                "print the result as one JSON document (an error document on failure; schema in "
                "docs/cli.md); the exit status is the same");
  cmd->footer(
      "Grouped modules are compared expert by expert, so a per-expert file and its single-layout\n"
      "conversion are the same; so are a family's Hub and v5 forms where transformers splits or\n"
      "concatenates tensors that are not experts (the rules' joins: grouplin rules lists them).\n"
      "Values must be bit-identical (-0.0 differs from 0.0). Reads both\n"
      "files once, in 256 KiB pieces; .pt storage CRCs are checked too.\n"
      "Exit: 0 same; 1 different (first differences listed: entry, element index, values);\n"
      "2 unreadable or invalid input.\n\n"
      "Examples:\n"
      "  grouplin verify model.safetensors single.pt\n"
      "  grouplin verify a.pt b.pt --max-listed 50\n"
      "  grouplin verify Qwen3-30B-A3B/ Qwen3-30B-A3B-fused/");
  cmd->callback([c] { run_verify(*c); });
}

}  // namespace grouplin::cli
