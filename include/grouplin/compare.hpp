// Comparing the values of two checkpoints, whatever their layouts and formats, files or sharded
// directories.
//
//   grouplin::CompareReport r = grouplin::compare_checkpoints("a.pt", "b.safetensors");
//   if (!r.same) for (const std::string& line : r.differences) std::cout << line << "\n";
//
// Both files are brought to one form without copying (every grouped module per-expert, under
// its family's per-expert names, or, for a family stored stacked only, stacked under
// transformers v5's names); a Hub-form and a v5-form save of one model then read the same. The
// two must have the same entry names (but for the rules' joins: a tensor that one file stores
// whole and the other in parts compares with its parts' concatenation), and each entry the same
// dtype, the same shape and the same bytes (bit equality: -0.0 differs from 0.0, a NaN equals only
// the same NaN). Data is read with pread in 256 KiB pieces, so memory stays small whatever the file
// size. Safetensors metadata is not compared; the CRC-32 of every .pt storage record is checked
// (PtReadOptions::check_storage_crc). compare_checkpoints shares no state: any number of calls may
// run at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "grouplin/checkpoint.hpp"
#include "grouplin/checkpoint_layout.hpp"
#include "grouplin/error.hpp"

namespace grouplin {

struct CompareOptions {
  // Differences described in CompareReport::differences (the count covers them all).
  size_t max_listed = 10;
  // How grouped modules are named in both files (layout_rules.hpp); empty: detected per file.
  std::vector<LayoutRules> rules{};
  // config.json's model_type, for detection; empty: each input directory's own config.json.
  std::string model_type{};
  // Of .pt training checkpoints, the dict of tensors to read on both sides
  // (PtReadOptions::state_dict_key); empty: the top level, or its only dict of tensors.
  std::string state_dict_key{};
  // Called on the calling thread at the start, after every 16 MiB of values compared and at the
  // end, with the bytes compared so far and A's bytes in all (the total is A's: entries only in A
  // count without being read). May be empty; may throw to abandon the comparison.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

struct CompareReport {
  bool same = true;
  CheckpointFormat format_a = CheckpointFormat::Safetensors;
  CheckpointFormat format_b = CheckpointFormat::Safetensors;
  std::vector<GroupedModule> modules_a;  // as found, in each file's own layout
  std::vector<GroupedModule> modules_b;
  size_t shards_a = 0;  // shard files of a directory; 0 for a single file
  size_t shards_b = 0;
  size_t tensors_compared = 0;  // entries present in both, per-expert form
  uint64_t bytes_compared = 0;
  // Entries that differ: present in one file only, another dtype or shape, or other values.
  size_t differing = 0;
  // The first max_listed of them, one line each, in A's order, the joins, then B's extra entries:
  //   "model.experts.weight3": 12 of 4096 elements differ, first at [0, 5]: 0.25 vs 0.5
  //   "model.experts.bias1": only in A
  //   "m.conv1d.weight" (A; joined from "m.q_conv1d.weight", ... of B): 1 of 96 elements ...
  std::vector<std::string> differences;
  // What A, then B, get wrong without stopping the comparison, as Checkpoint::warnings (a
  // directory index's total_size that is not its tensors' bytes).
  std::vector<Problem> warnings;
};

// Compares the checkpoints at `a` and `b` (files or directories; see above). Throws Error for a
// file or directory that cannot be read or fails validation, or whose grouped modules are
// inconsistent (the codes of load_checkpoint and scan_grouped_modules, messages naming the file).
CompareReport compare_checkpoints(const std::string& a, const std::string& b,
                                  const CompareOptions& options = {});

// The report as the JSON document of `grouplin verify --json` (Python's grouplin.verify reads
// it): A and B as given, the fields above; schema in docs/cli.md, fields only ever added. Pure
// ASCII, indented by 2, no final newline.
std::string compare_report_json(const CompareReport& report, const std::string& a,
                                const std::string& b);

}  // namespace grouplin
