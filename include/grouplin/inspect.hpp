// What a checkpoint holds, read from its headers only.
//
//   grouplin::CheckpointSummary s = grouplin::inspect_checkpoint("model.safetensors");
//   for (const auto& [name, t] : s.tensors) std::cout << name << " " << t.nbytes() << "\n";
//   for (const grouplin::GroupedModule& m : s.scan.modules) std::cout << m.prefix << "\n";
//   if (!s.scan.problems.empty()) std::cerr << s.scan.problems.front().what() << "\n";
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "grouplin/checkpoint.hpp"
#include "grouplin/checkpoint_layout.hpp"
#include "grouplin/error.hpp"
#include "grouplin/state_dict.hpp"

namespace grouplin {

struct CheckpointSummary {
  CheckpointFormat format = CheckpointFormat::Safetensors;
  uint64_t file_bytes = 0;  // of the file, or of all the shards
  // In file order (a directory: natural key order, layers.2 before layers.10); views of
  // read-only mappings (not read by this call).
  StateDict tensors;
  // safetensors "__metadata__"; of a directory, the entries all its shards agree on.
  std::map<std::string, std::string> metadata;
  GroupedScan scan;  // grouped modules, and the problems of inconsistent ones
  // For a directory (sharded_checkpoint.hpp): its index ("" when it has none), its shards, its
  // other files, the weight files and entries that are not its shards, config.json's model_type;
  // all names relative to the directory.
  bool directory = false;
  std::string snapshot;  // of a Hugging Face cache folder: "snapshots/<rev>" (refs/main's), read
  std::string index_file;
  std::vector<std::string> shards;
  std::vector<std::string> other_files;
  std::vector<std::string> skipped_files;
  std::string model_type;
  // What the checkpoint gets wrong without stopping a reader, as Checkpoint::warnings (a
  // directory index's total_size that is not its tensors' bytes: TotalSizeMismatch).
  std::vector<Problem> warnings;
};

// Shares no state: any number of calls may run at once.
// Validates the checkpoint at `path` (a file, or a directory of shards) with its format's reader
// and scans it for grouped modules,
// reading only what the reader needs (headers, the .pt pickle and zip directory); no read-ahead
// of tensor data is started. Inconsistent expert sets are reported in scan.problems, not thrown,
// and so are FP8 scales of a dense layer that fit no block of its weight (ScaleShapeMismatch).
// Throws Error(IoError), Error(UnknownFormat) and the readers' errors, naming the file.
// Also the directory errors of sharded_checkpoint.hpp. `rules` as in scan_grouped_modules
// (empty: detected from the keys and `model_type`, or a directory's config.json when empty).
// `state_dict_key`: of a .pt training checkpoint, the dict of tensors to read
// (PtReadOptions::state_dict_key).
CheckpointSummary inspect_checkpoint(const std::string& path,
                                     const std::vector<LayoutRules>& rules = {},
                                     std::string_view model_type = "",
                                     std::string_view state_dict_key = "");

// What a summary adds up to: every tensor's bytes, the grouped modules' experts and bytes.
struct CheckpointTotals {
  uint64_t tensor_bytes = 0;
  uint64_t experts = 0;
  uint64_t grouped_bytes = 0;
};
CheckpointTotals checkpoint_totals(const CheckpointSummary& summary);

// The JSON document of `grouplin inspect --json` (and Python's grouplin.inspect) for the summary
// of the checkpoint at `path`: schema in docs/cli.md, fields only ever added. Pure ASCII (other
// characters as \uXXXX, bytes that are not UTF-8 as U+FFFD), indented by 2, no final newline.
std::string inspect_json(const CheckpointSummary& summary, const std::string& path);

}  // namespace grouplin
