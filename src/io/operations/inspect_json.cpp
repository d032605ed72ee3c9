// The inspect document: one implementation for `grouplin inspect --json` and Python's
// grouplin.inspect, so that the two can never disagree on a field.
#include <nlohmann/json.hpp>
#include <string>

#include "grouplin/inspect.hpp"

namespace grouplin {
namespace {

// Version of the document; bumped only if a field changes meaning or goes away.
constexpr int kInspectSchemaVersion = 1;

using nlohmann::ordered_json;

ordered_json module_json(const GroupedModule& m) {
  ordered_json tensors_of = ordered_json::array();
  for (const ExpertTensor& t : m.tensors) {
    tensors_of.push_back({{"name", t.name},
                          {"layout", std::string(layout_name(t.layout))},
                          {"expert_shape", t.expert_shape},
                          {"dtype", std::string(dtype_name(t.dtype))},
                          {"keys", t.keys},
                          {"transposed", t.transposed},
                          {"interleave", t.interleave},
                          {"folded", t.folded}});
    if (!t.scale_of.empty()) {
      tensors_of.back()["scale_of"] = t.scale_of;
      tensors_of.back()["block"] = t.block;
    }
  }
  return {{"prefix", m.prefix},
          {"layout", m.mixed ? std::string("mixed") : std::string(layout_name(m.layout))},
          {"num_experts", m.num_experts},
          {"out_features", m.out_features},
          {"in_features", m.in_features},
          {"bias", m.bias},
          {"dtype", std::string(dtype_name(m.dtype))},
          {"bias_dtype",
           m.bias ? ordered_json(std::string(dtype_name(m.bias_dtype))) : ordered_json(nullptr)},
          {"keys", m.keys},
          {"rules", m.rules},
          {"stacked_only", m.stacked_only},
          {"tensors", std::move(tensors_of)}};
}

}  // namespace

CheckpointTotals checkpoint_totals(const CheckpointSummary& s) {
  CheckpointTotals t;
  for (const auto& [name, tensor] : s.tensors) t.tensor_bytes += tensor.nbytes();
  for (const GroupedModule& m : s.scan.modules) {
    t.experts += static_cast<uint64_t>(m.num_experts);
    for (const std::string& k : m.keys) t.grouped_bytes += s.tensors.at(k).nbytes();
  }
  return t;
}

std::string inspect_json(const CheckpointSummary& s, const std::string& path) {
  ordered_json doc;
  doc["schema_version"] = kInspectSchemaVersion;
  doc["file"] = path;
  doc["format"] = std::string(format_name(s.format));
  doc["file_bytes"] = s.file_bytes;
  doc["directory"] = s.directory;
  if (s.directory) {
    if (!s.snapshot.empty()) doc["snapshot"] = s.snapshot;
    doc["index_file"] = s.index_file.empty() ? ordered_json(nullptr) : ordered_json(s.index_file);
    doc["shards"] = s.shards;
    doc["other_files"] = s.other_files;
    doc["skipped_files"] = s.skipped_files;
    doc["model_type"] = s.model_type;
  }
  doc["metadata"] = ordered_json::object();
  for (const auto& [k, v] : s.metadata) doc["metadata"][k] = v;
  ordered_json tensors = ordered_json::array();
  for (const auto& [name, t] : s.tensors) {
    tensors.push_back({{"name", name},
                       {"dtype", std::string(dtype_name(t.dtype()))},
                       {"shape", t.shape()},
                       {"bytes", static_cast<uint64_t>(t.nbytes())}});
  }
  doc["tensors"] = std::move(tensors);
  ordered_json modules = ordered_json::array();
  for (const GroupedModule& m : s.scan.modules) modules.push_back(module_json(m));
  doc["grouped_modules"] = std::move(modules);
  ordered_json problems = ordered_json::array();
  for (const Error& e : s.scan.problems) {
    problems.push_back(
        {{"code", std::string(error_code_name(e.code()))}, {"message", e.message()}});
  }
  doc["problems"] = std::move(problems);
  ordered_json unconfirmed = ordered_json::array();
  for (const UnconfirmedStack& u : s.scan.unconfirmed) {
    unconfirmed.push_back(
        {{"prefix", u.prefix}, {"name", u.name}, {"needs", u.needs}, {"rules", u.rules}});
  }
  doc["unconfirmed"] = std::move(unconfirmed);
  ordered_json warnings = ordered_json::array();
  for (const Problem& w : s.warnings) {
    warnings.push_back(
        {{"code", std::string(error_code_name(w.code))}, {"key", w.key}, {"message", w.message}});
  }
  doc["warnings"] = std::move(warnings);
  const CheckpointTotals t = checkpoint_totals(s);
  doc["totals"] = {{"tensors", s.tensors.size()},
                   {"tensor_bytes", t.tensor_bytes},
                   {"grouped_modules", s.scan.modules.size()},
                   {"experts", t.experts},
                   {"grouped_bytes", t.grouped_bytes}};
  // Pure ASCII, so that no name can carry a control or a direction override to a terminal;
  // bytes that are not UTF-8 (a .pt name may hold a lone surrogate, a path any byte) become
  // U+FFFD rather than an invalid document.
  return doc.dump(2, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
}

}  // namespace grouplin
