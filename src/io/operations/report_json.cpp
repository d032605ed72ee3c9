// The documents of `grouplin convert --json` and `grouplin verify --json`, which Python's
// grouplin.convert and grouplin.verify return too: one implementation, so that the command line
// and the package can never disagree on a field.
#include <nlohmann/json.hpp>
#include <string>

#include "grouplin/compare.hpp"
#include "grouplin/convert.hpp"

namespace grouplin {
namespace {

// Version of each document; bumped only if a field changes meaning or goes away.
constexpr int kReportSchemaVersion = 1;

using nlohmann::ordered_json;

ordered_json problems_json(const std::vector<Problem>& problems) {
  ordered_json out = ordered_json::array();
  for (const Problem& p : problems) {
    out.push_back(
        {{"code", std::string(error_code_name(p.code))}, {"key", p.key}, {"message", p.message}});
  }
  return out;
}

ordered_json modules_json(const std::vector<GroupedModule>& modules) {
  ordered_json out = ordered_json::array();
  for (const GroupedModule& m : modules) {
    out.push_back({{"prefix", m.prefix},
                   {"layout", m.mixed ? std::string("mixed") : std::string(layout_name(m.layout))},
                   {"num_experts", m.num_experts},
                   {"rules", m.rules}});
  }
  return out;
}

// As inspect_json: pure ASCII, bytes that are not UTF-8 as U+FFFD.
std::string dump(const ordered_json& doc) {
  return doc.dump(2, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
}

}  // namespace

std::string convert_report_json(const ConvertReport& r, const std::string& in,
                                const std::string& out) {
  ordered_json doc;
  doc["schema_version"] = kReportSchemaVersion;
  doc["input"] = in;
  doc["output"] = out;
  doc["input_format"] = std::string(format_name(r.input_format));
  doc["output_format"] = std::string(format_name(r.output_format));
  doc["layout"] = std::string(layout_name(r.layout));
  doc["grouped_modules"] = r.modules.size();
  doc["modules"] = modules_json(r.modules);
  doc["rules"] = r.rules;
  doc["rules_from"] = r.rules_from == RulesFrom::Given       ? "given"
                      : r.rules_from == RulesFrom::ModelType ? "model_type"
                                                             : "names";
  doc["input_tensors"] = r.input_tensors;
  doc["output_tensors"] = r.output_tensors;
  doc["data_bytes"] = r.data_bytes;
  doc["file_bytes"] = r.file_bytes;
  doc["dequantized"] = r.dequantized;
  doc["directory_output"] = r.directory_output;
  doc["output_files"] = r.output_files;
  doc["copied_files"] = r.copied_files;
  doc["copied_bytes"] = r.copied_bytes;
  doc["skipped_files"] = r.skipped_files;
  doc["left_files"] = r.left_files;
  doc["edited_files"] = r.edited_files;
  doc["warnings"] = problems_json(r.warnings);
  return dump(doc);
}

std::string compare_report_json(const CompareReport& r, const std::string& a,
                                const std::string& b) {
  ordered_json doc;
  doc["schema_version"] = kReportSchemaVersion;
  doc["a"] = a;
  doc["b"] = b;
  doc["same"] = r.same;
  doc["format_a"] = std::string(format_name(r.format_a));
  doc["format_b"] = std::string(format_name(r.format_b));
  doc["shards_a"] = r.shards_a;
  doc["shards_b"] = r.shards_b;
  doc["modules_a"] = modules_json(r.modules_a);
  doc["modules_b"] = modules_json(r.modules_b);
  doc["tensors_compared"] = r.tensors_compared;
  doc["bytes_compared"] = r.bytes_compared;
  doc["differing"] = r.differing;
  doc["differences"] = r.differences;
  doc["warnings"] = problems_json(r.warnings);
  return dump(doc);
}

}  // namespace grouplin
