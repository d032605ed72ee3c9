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
#include "grouplin/state_dict.hpp"

namespace grouplin {

struct CheckpointSummary {
  CheckpointFormat format = CheckpointFormat::Safetensors;
  uint64_t file_bytes = 0;
  StateDict tensors;  // in file order; views of a read-only mapping (not read by this call)
  std::map<std::string, std::string> metadata;  // safetensors "__metadata__"
  GroupedScan scan;  // grouped modules, and the problems of inconsistent ones
};

// Shares no state: any number of calls may run at once.
// Validates the checkpoint at `path` with its format's reader and scans it for grouped modules,
// reading only what the reader needs (headers, the .pt pickle and zip directory); no read-ahead
// of tensor data is started. Inconsistent expert sets are reported in scan.problems, not thrown.
// Throws Error(IoError), Error(UnknownFormat) and the readers' errors, naming the file.
// `rules` as in scan_grouped_modules (empty: detected from the keys and `model_type`).
CheckpointSummary inspect_checkpoint(const std::string& path,
                                     const std::vector<LayoutRules>& rules = {},
                                     std::string_view model_type = "");

}  // namespace grouplin
