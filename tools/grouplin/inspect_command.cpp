// grouplin inspect CHECKPOINT... [--json] [--modules]: every tensor, every grouped module,
// totals; for a directory also its index, shards and other files. The JSON schema is
// documented in docs/cli.md; fields are only ever added.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "cli/progress.hpp"
#include "cli/rules_option.hpp"
#include "grouplin/grouplin.hpp"
#include "grouplin/inspect.hpp"

namespace grouplin::cli {
namespace {

struct InspectConfig {
  std::vector<std::string> files;
  bool json = false;
  bool modules_only = false;
  std::string rules;
  std::string state_dict;
};

// What GroupLin makes of a model type: " (rules: its family's)", or why it has none.
std::string family_note(const std::string& model_type) {
  for (const ModelFamily& f : model_families()) {
    if (f.model_type != model_type) continue;
    if (f.structure.empty())
      return " (GroupLin has no rules for this family: " + f.not_applied + ")";
    return " (rules: " + f.model_type + ", structure " + f.structure + ")";
  }
  return " (no MoE family GroupLin knows: the rules are detected from the names)";
}

// How a module's family stores it, when that is not the per-expert orientation in order:
// " (stacked only; gate_up_proj stored [N, in, out], rows in 2 interleaved groups)".
std::string storage_note(const GroupedModule& m) {
  std::string note = m.stacked_only ? "stacked only" : "";
  for (const ExpertTensor& t : m.tensors) {
    if (!t.scale_of.empty()) {  // "FP8 scales of gate_up_proj in [128, 128] blocks"
      note += (note.empty() ? "" : "; ") + std::string("FP8 scales of ") +
              escaped(t.scale_of.substr(std::min(t.scale_of.size(), m.prefix.size()))) +
              (t.block.empty() ? std::string(", one per expert")
                               : " in [" + std::to_string(t.block[0]) + ", " +
                                     std::to_string(t.block[1]) + "] blocks");
    }
    if (!t.transposed && t.interleave <= 1 && !t.folded) continue;
    note += note.empty() ? "" : (note == "stacked only" ? "; " : ", ");
    note += escaped(t.name.substr(std::min(t.name.size(), m.prefix.size()))) + " stored";
    if (t.folded) {
      note += t.transposed ? " [N * in, out]" : " [N * out, in]";
    } else if (t.transposed) {
      note += " [N, in, out]";
    }
    if (t.interleave > 1) {
      note += (t.transposed ? ", rows in " : " with rows in ") + std::to_string(t.interleave) +
              " interleaved groups";
    }
  }
  return note.empty() ? "" : " (" + note + ")";
}

void print_text(const InspectConfig& c, const std::string& file, const CheckpointSummary& s) {
  if (!s.directory) {
    std::printf("%s: %s, %s (%llu bytes)\n", escaped(file).c_str(),
                std::string(format_name(s.format)).c_str(), format_bytes(s.file_bytes).c_str(),
                static_cast<unsigned long long>(s.file_bytes));
  } else {
    std::printf("%s: %s directory, %zu shard(s), %s (%llu bytes)\n", escaped(file).c_str(),
                std::string(format_name(s.format)).c_str(), s.shards.size(),
                format_bytes(s.file_bytes).c_str(), static_cast<unsigned long long>(s.file_bytes));
    if (!s.snapshot.empty()) {
      std::printf("snapshot: %s (a Hugging Face cache folder: the revision refs/main names)\n",
                  escaped(s.snapshot).c_str());
    }
    std::printf("index: %s\nshards: %s\n",
                !s.index_file.empty() ? escaped(s.index_file).c_str()
                : s.format == CheckpointFormat::Safetensors
                    ? "none (every *.safetensors file is a shard)"
                    : "none (its one .pt / .bin file is the shard)",
                name_list(s.shards).c_str());
    if (!s.model_type.empty()) {
      std::printf("model_type: %s%s\n", escaped(s.model_type).c_str(),
                  family_note(s.model_type).c_str());
    }
    if (!s.other_files.empty()) {
      std::printf("other files: %s\n", name_list(s.other_files).c_str());
    }
    if (!s.skipped_files.empty()) {
      std::printf("not read (not this checkpoint's shards): %s\n",
                  name_list(s.skipped_files).c_str());
    }
  }
  if (!s.metadata.empty()) {
    std::printf("metadata:\n");
    for (const auto& [k, v] : s.metadata) {
      std::printf("  %s = %s\n", escaped(k).c_str(), escaped(v).c_str());
    }
  }
  // Names come from the file: printed escaped, never as raw bytes (escape sequences, bidi).
  std::vector<std::string> names;
  names.reserve(s.tensors.size());
  size_t width = 4;
  for (const auto& [name, t] : s.tensors) {
    names.push_back(escaped(name));
    width = std::max(width, names.back().size());
  }
  if (c.modules_only) {
    std::printf("tensors: %zu (listed without --modules)\n", s.tensors.size());
  } else {
    std::printf("tensors:\n  %-*s  %-7s  %-20s  %s\n", static_cast<int>(width), "name", "dtype",
                "shape", "bytes");
  }
  size_t row = 0;
  for (const auto& [name, t] : s.tensors) {
    if (c.modules_only) break;
    std::printf("  %-*s  %-7s  %-20s  %llu\n", static_cast<int>(width), names[row++].c_str(),
                std::string(dtype_name(t.dtype())).c_str(), shape_to_string(t.shape()).c_str(),
                static_cast<unsigned long long>(t.nbytes()));
  }
  if (s.scan.modules.empty()) {
    std::printf("grouped modules: none\n");
  } else {
    size_t pw = 6;
    for (const GroupedModule& m : s.scan.modules) pw = std::max(pw, quote(m.prefix).size());
    std::printf("grouped modules:\n  %-*s  %-10s  %6s  %6s  %6s  %-5s  %-8s  %s\n",
                static_cast<int>(pw), "prefix", "layout", "N", "out", "in", "bias", "dtype",
                "rules");
    for (const GroupedModule& m : s.scan.modules) {
      std::string prefix = quote(m.prefix);
      std::string dtype(dtype_name(m.dtype));
      if (m.bias && m.bias_dtype != m.dtype)
        dtype += " (bias " + std::string(dtype_name(m.bias_dtype)) + ")";
      std::printf("  %-*s  %-10s  %6lld  %6lld  %6lld  %-5s  %-8s  %s%s\n", static_cast<int>(pw),
                  prefix.c_str(), m.mixed ? "mixed" : std::string(layout_name(m.layout)).c_str(),
                  static_cast<long long>(m.num_experts), static_cast<long long>(m.out_features),
                  static_cast<long long>(m.in_features), m.bias ? "yes" : "no", dtype.c_str(),
                  escaped(m.rules).c_str(), storage_note(m).c_str());
    }
  }
  if (!s.scan.unconfirmed.empty()) {
    std::printf(
        "not taken for grouped modules (stacked alone: no bias, scales or declaration beside "
        "them; --rules takes them):\n");
    for (const UnconfirmedStack& u : s.scan.unconfirmed) {
      std::printf("  %s %s without %s (--rules %s)\n", escaped(u.name).c_str(),
                  shape_to_string(s.tensors.at(u.name).shape()).c_str(), quote(u.needs).c_str(),
                  escaped(u.rules).c_str());
    }
  }
  if (!s.warnings.empty()) {
    std::printf("warnings (readers go on):\n");
    for (const Problem& w : s.warnings) {
      std::printf("  %s: %s\n", std::string(error_code_name(w.code)).c_str(), w.message.c_str());
    }
  }
  if (!s.scan.problems.empty()) {
    std::printf("problems (convert refuses a grouped module's; --dtype any):\n");
    for (const Error& e : s.scan.problems) std::printf("  %s\n", e.what());
  }
  const CheckpointTotals t = checkpoint_totals(s);
  std::printf("totals: %zu tensors, %s (%llu bytes); %zu grouped modules, %llu experts, %s\n",
              s.tensors.size(), format_bytes(t.tensor_bytes).c_str(),
              static_cast<unsigned long long>(t.tensor_bytes), s.scan.modules.size(),
              static_cast<unsigned long long>(t.experts), format_bytes(t.grouped_bytes).c_str());
}

// One checkpoint: its listing (text, or its document appended to `docs`), its problems said on
// stderr; a file that cannot be read is said on stderr (and as an error document in `docs`).
// Each failure sets exit code 2; the other paths are still inspected.
void inspect_one(const InspectConfig& c, const std::string& file, std::vector<std::string>& docs) {
  try {
    const CheckpointSummary s =
        inspect_checkpoint(file, rules_from_option(c.rules), "", c.state_dict);
    if (c.json) {
      docs.push_back(inspect_json(s, file));
    } else {
      print_text(c, file, s);
    }
    if (!s.scan.problems.empty()) {
      std::cerr << "grouplin: " << quote(file) << ": " << s.scan.problems.size()
                << " problem(s) (inconsistent grouped modules, FP8 scales that fit no block or "
                   "lack their weight); the first: "
                << s.scan.problems.front().what() << "\n";
      g_exit_code = 2;
    }
  } catch (const Error& e) {
    if (c.files.size() == 1 && !c.json) throw;  // main() says it, as for every command
    std::cerr << "grouplin: " << e.what() << "\n";
    if (c.json) docs.push_back(error_json(e, {{"file", file}}));
    g_exit_code = 2;
  }
}

void run_inspect(const InspectConfig& c) {
  std::vector<std::string> docs;
  for (size_t i = 0; i < c.files.size(); ++i) {
    if (i > 0 && !c.json) std::printf("\n");  // a blank line between listings
    std::fflush(stdout);                      // each listing before the next one's errors
    inspect_one(c, c.files[i], docs);
  }
  if (!c.json) return;
  if (docs.size() == 1) {
    std::cout << docs[0] << "\n";
    return;
  }
  std::cout << "[\n";  // several paths: an array of their documents, in order
  for (size_t i = 0; i < docs.size(); ++i)
    std::cout << docs[i] << (i + 1 < docs.size() ? ",\n" : "\n");
  std::cout << "]\n";
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto config = std::make_shared<InspectConfig>();
  CLI::App* cmd = app.add_subcommand(
      "inspect",
      "List every tensor (name, dtype, shape, bytes) and every grouped module of a "
      "checkpoint (safetensors or .pt, detected by content; a file or a sharded directory)");
  cmd->add_option("CHECKPOINT", config->files,
                  "checkpoint files, or directories of shards (Hugging Face: with an index, or "
                  "every *.safetensors; a cache folder models--org--name), one or more")
      ->required();
  cmd->add_flag("--json", config->json,
                "print one JSON document per checkpoint (an array of them for several; an error "
                "document for one that cannot be read; schema in docs/cli.md)");
  cmd->add_flag("--modules", config->modules_only,
                "leave out the list of tensors: grouped modules, warnings and totals only");
  cmd->add_option("--rules", config->rules, kRulesHelp);
  cmd->add_option("--state-dict", config->state_dict, kStateDictHelp);
  cmd->footer(
      "Reads headers only: instant on checkpoints of any size. A directory is checked against\n"
      "its index (every shard there, every tensor where the index says), and its config.json's\n"
      "model_type picks the rules of fused experts. An index whose total_size is not its\n"
      "tensors' bytes is listed under warnings (TotalSizeMismatch), as transformers ignores it.\n"
      "Exit: 0 read and understood (warnings or not); 2 unreadable, invalid, or an\n"
      "inconsistent expert set (listed under problems), for any of the checkpoints (the\n"
      "others are still listed).\n\n"
      "Examples:\n"
      "  grouplin inspect model.safetensors\n"
      "  grouplin inspect ~/.cache/huggingface/hub/models--Qwen--Qwen3-30B-A3B   # refs/main\n"
      "  grouplin inspect model.pt --json | jq '.grouped_modules[] | {prefix, layout, "
      "num_experts}'");
  cmd->callback([config] { run_inspect(*config); });
}

}  // namespace grouplin::cli
