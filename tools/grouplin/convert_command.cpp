// grouplin convert IN OUT [--layout single|per-expert|keep] [--format safetensors|pt]
//                  [--dtype f32|bf16] [--max-shard-size SIZE] [--force] [--quiet]
// The work is grouplin::convert_checkpoint; this file parses options, draws the progress bar and
// turns Ctrl-C or SIGTERM into Error(Interrupted) (the temporary file is removed, OUT is left as
// it was, and main() exits 130 or 143).
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include "cli/commands.hpp"
#include "cli/interrupt.hpp"
#include "cli/progress.hpp"
#include "cli/rules_option.hpp"
#include "grouplin/convert.hpp"
#include "grouplin/error.hpp"
#include "grouplin/sharded_checkpoint.hpp"

namespace grouplin::cli {
namespace {

struct ConvertConfig {
  std::string in;
  std::string out;
  std::string layout;
  std::string format;
  bool force = false;
  bool quiet = false;
  bool json = false;
  std::string rules;
  std::string experts;
  std::string max_shard_size;
  std::string dtype;
  std::string state_dict;
};

void run_convert(const ConvertConfig& c) {
  ConvertOptions o;
  o.layout = expert_layout_from_name(c.layout);  // CLI11 checked the spelling; keep: nullopt
  if (!c.format.empty()) {
    o.format = c.format == "pt" ? CheckpointFormat::Pt : CheckpointFormat::Safetensors;
  }
  o.overwrite = c.force;
  o.rules = rules_from_option(c.rules);
  o.state_dict_key = c.state_dict;
  if (!c.experts.empty()) o.experts = experts_from_option(c.experts);
  if (!c.dtype.empty()) o.dtype = c.dtype == "f32" ? DType::F32 : DType::BF16;
  if (!c.max_shard_size.empty()) {
    try {
      o.max_shard_size = parse_byte_size(c.max_shard_size);
    } catch (const Error& e) {
      throw Error(e.code(), "--max-shard-size: " + e.message());
    }
  }
  ProgressBar bar("converting", c.quiet || c.json, "flushing to disk");
  // The conversion checks for a signal at its progress points: at the start, after every 16 MiB
  // and after the last byte. A signal that comes later (during the final fsync and rename) does
  // not stop it: the output is then complete, and the command succeeds.
  o.progress = [&bar, &c](uint64_t done, uint64_t total) {
    if (const int signal = interrupt_signal()) {
      throw Error(ErrorCode::Interrupted, "converting " + grouplin::quote(c.in) +
                                              ": interrupted by " + signal_description(signal) +
                                              " after " + format_bytes(done) + " of " +
                                              format_bytes(total) + " of tensor data; the output " +
                                              grouplin::quote(c.out) + " was not written");
    }
    bar.update(done, total);
  };

  InterruptGuard guard;
  const auto start = std::chrono::steady_clock::now();
  ConvertReport r;
  try {
    r = convert_checkpoint(c.in, c.out, o);
  } catch (const Error& e) {
    if (c.json) std::cout << error_json(e, {{"input", c.in}, {"output", c.out}}) << "\n";
    throw;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  bar.finish();
  print_warnings(r.warnings);
  if (c.json) {
    std::cout << convert_report_json(r, c.in, c.out) << "\n";
    return;
  }
  if (c.quiet) return;

  size_t converted = 0;
  for (const GroupedModule& m : r.modules) converted += m.mixed || m.layout != r.layout;
  std::string out_desc =
      std::string(format_name(r.output_format)) + ", " + format_bytes(r.file_bytes);
  if (r.directory_output) {
    out_desc = std::string(format_name(r.output_format)) + " directory, " +
               std::to_string(r.output_files.size()) + " file(s), " + format_bytes(r.file_bytes);
    if (!r.copied_files.empty()) {
      out_desc += "; " + std::to_string(r.copied_files.size()) + " other file(s) copied, " +
                  format_bytes(r.copied_bytes);
    }
  }
  const std::string modules =
      o.layout ? std::to_string(converted) + " converted to " + std::string(layout_name(r.layout))
               : "layout kept (" + std::string(layout_name(r.layout)) + ")";
  std::printf(
      "%s (%s) -> %s (%s): %zu grouped module(s), %s; %zu -> %zu tensors; %s in %.2f s "
      "(%s/s)\n",
      escaped(c.in).c_str(), std::string(format_name(r.input_format)).c_str(),
      escaped(c.out).c_str(), out_desc.c_str(), r.modules.size(), modules.c_str(), r.input_tensors,
      r.output_tensors, format_bytes(r.data_bytes).c_str(), seconds,
      format_bytes(seconds > 0 ? static_cast<uint64_t>(r.data_bytes / seconds) : 0).c_str());
  if (!r.rules.empty()) {
    std::string names;
    for (const std::string& n : r.rules) names += (names.empty() ? "" : ", ") + n;
    std::printf("rules: %s (%s)\n", names.c_str(),
                r.rules_from == RulesFrom::Given       ? "--rules"
                : r.rules_from == RulesFrom::ModelType ? "config.json's model_type"
                                                       : "detected from the names");
  }
  if (r.dequantized > 0) {
    std::printf("dequantized: %zu FP8 weight(s) written as %s, their scales dropped\n",
                r.dequantized, c.dtype == "f32" ? "F32" : "BF16");
  }
  for (const std::string& e : r.edited_files) std::printf("edited: %s\n", e.c_str());
  if (!r.left_files.empty()) {
    std::printf(
        "left in %s (a file output holds tensors only; an OUT without extension is a "
        "directory that gets them): %s\n",
        escaped(c.in).c_str(), name_list(r.left_files).c_str());
  }
  if (!r.skipped_files.empty()) {
    std::printf(
        "not copied (weight files that are not the input's shards, or not files): %zu (%s)\n",
        r.skipped_files.size(), name_list(r.skipped_files).c_str());
  }
}

}  // namespace

void add_convert_command(CLI::App& app) {
  auto c = std::make_shared<ConvertConfig>();
  CLI::App* cmd = app.add_subcommand(
      "convert",
      "Rewrite every grouped module of a checkpoint in one layout, in either format, "
      "streaming (memory stays near 1 MiB whatever the file size)");
  cmd->add_option("IN", c->in,
                  "input checkpoint: a file (safetensors or .pt, detected by content) or a "
                  "directory of shards")
      ->required();
  cmd->add_option("OUT", c->out,
                  "output checkpoint, written atomically: a file, or a directory when IN is one "
                  "and OUT has no .safetensors/.pt/.pth/.bin extension, or with --max-shard-size")
      ->required();
  cmd->add_option("--layout", c->layout,
                  "single: P.weight [N, out, in], P.bias [N, out]; "
                  "per-expert: P.weight0..P.weight{N-1}, P.bias0..; keep (the default): the "
                  "layout IN has, for a change of format, sharding, dtype or experts only")
      ->check(CLI::IsMember({"single", "per-expert", "keep"}));
  cmd->add_option("--format", c->format,
                  "output format (default: IN's for a directory OUT, else from OUT's extension: "
                  ".safetensors; .pt .pth .bin)")
      ->check(CLI::IsMember({"safetensors", "pt"}));
  cmd->add_option("--rules", c->rules, kRulesHelp);
  cmd->add_option("--state-dict", c->state_dict, kStateDictHelp);
  cmd->add_option("--experts", c->experts,
                  "keep only experts BEGIN:END (end excluded) of every grouped module, "
                  "renumbered from 0: one expert-parallel rank's share, reading only its bytes");
  cmd->add_option("--dtype", c->dtype,
                  "write every FP8 weight that has its scales beside it (W, W_scale_inv) as "
                  "its values in this dtype and drop the scales; nothing else changes")
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--max-shard-size", c->max_shard_size,
                  "write OUT as a directory of shards of at most SIZE tensor bytes each: 5GB, "
                  "500MB, 40KB (1 KB = 1000 bytes), 2GiB (default for a directory: 5GB)");
  cmd->add_flag("--force", c->force,
                "replace OUT if it exists (never IN); a directory OUT only when it holds nothing "
                "but shards, an index and files copied from IN");
  cmd->add_flag("--quiet", c->quiet, "no progress bar, no summary");
  cmd->add_flag("--json", c->json,
                "print the report as one JSON document instead of the summary (an error document "
                "on failure; schema in docs/cli.md)");
  cmd->footer(
      "Every other entry passes through unchanged; safetensors metadata is kept. A directory OUT\n"
      "gets Hugging Face's shard names (model-00001-of-00003.safetensors), an index with exact\n"
      "total_size and weight_map, and every other file of an input directory (config.json,\n"
      "tokenizer files) unchanged; it is built beside OUT and renamed into place. The progress\n"
      "bar shows only on a terminal. Nothing is left at OUT on failure or Ctrl-C.\n"
      "--force replaces a directory OUT only when everything in it is what a conversion writes:\n"
      "weight and index files (*.safetensors, *.pt, *.pth, pytorch_model*.bin, *.index.json)\n"
      "directly in it, and the files copied from IN (config.json, tokenizer files, their\n"
      "folders). Anything else (thesis.tex, a folder of one's own) is refused, listed, and left\n"
      "untouched (OutputHoldsOtherFiles).\n"
      "Exit: 0 converted; 2 bad usage or bad input (unreadable or invalid IN, inconsistent\n"
      "expert set, OUT exists without --force, OUT holds other files, OUT is IN, unknown\n"
      "output format);\n"
      "130 interrupted by Ctrl-C (SIGINT), 143 by SIGTERM (OUT left as it was).\n\n"
      "Examples:\n"
      "  grouplin convert model.safetensors single.safetensors --layout single\n"
      "  grouplin convert single.safetensors model.pt --layout per-expert\n"
      "  grouplin convert model.pt out.bin --layout single --format safetensors --force\n"
      "  grouplin convert qwen3-moe.safetensors fused.safetensors --layout single   # hf rules\n"
      "  grouplin convert fused.safetensors mixtral.safetensors --layout per-expert "
      "--rules hf-mixtral\n"
      "  grouplin convert model.safetensors rank3.safetensors --layout single --experts 96:128\n"
      "  grouplin convert DeepSeek-V3/ DeepSeek-V3-bf16/ --layout per-expert --dtype bf16\n"
      "  grouplin convert Qwen3-30B-A3B/ Qwen3-30B-A3B-fused/ --layout single\n"
      "  grouplin convert Mixtral-fused/ Mixtral/ --layout per-expert --max-shard-size 5GB");
  cmd->callback([c] { run_convert(*c); });
}

}  // namespace grouplin::cli
