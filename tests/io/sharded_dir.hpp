// Test helper: a Hugging Face-style checkpoint directory written from a state dict, its tensors
// dealt to shards as a test asks (so that one expert's tensors land in different shards), with
// or without an index, beside a config.json and a tokenizer file.
#pragma once

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "grouplin/safetensors.hpp"
#include "grouplin/state_dict.hpp"

namespace grouplin::testing {

struct ShardedSpec {
  size_t shards = 3;
  bool index = true;
  std::string model_type = "qwen3_moe";  // "" writes no config.json
};

// Tensor k of `sd` goes to shard k % spec.shards ("model-0000s-of-0000n.safetensors"), so that
// consecutive entries (one expert's gate, up and down) are in different shards. Returns the
// weight map (tensor -> shard file).
inline std::map<std::string, std::string> write_sharded(const std::filesystem::path& dir,
                                                        const StateDict& sd,
                                                        const ShardedSpec& spec = {}) {
  std::filesystem::create_directories(dir);
  std::vector<StateDict> parts(spec.shards);
  std::map<std::string, std::string> weight_map;
  uint64_t total = 0;
  size_t k = 0;
  auto shard_name = [&](size_t s) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", s + 1, spec.shards);
    return std::string(buf);
  };
  for (const auto& [name, t] : sd) {
    const size_t s = k++ % spec.shards;
    parts[s].insert(name, t);
    weight_map[name] = shard_name(s);
    total += t.nbytes();
  }
  for (size_t s = 0; s < spec.shards; ++s) {
    save_safetensors((dir / shard_name(s)).string(), parts[s], {{"format", "pt"}});
  }
  if (spec.index) {
    nlohmann::json j = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    std::ofstream(dir / "model.safetensors.index.json") << j.dump(2) << "\n";
  }
  if (!spec.model_type.empty()) {
    std::ofstream(dir / "config.json") << nlohmann::json({{"model_type", spec.model_type}}).dump();
  }
  std::ofstream(dir / "tokenizer.json") << R"({"version": "1.0"})";
  return weight_map;
}

// Writes `text` to the file at `p`.
inline void write_text(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

}  // namespace grouplin::testing
