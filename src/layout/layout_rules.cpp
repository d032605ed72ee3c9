// The JSON form of layout rules and the checks every rule set passes
// (include/grouplin/layout_rules.hpp, src/layout/compiled_rules.hpp).
#include "grouplin/layout_rules.hpp"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/parser_text.hpp"
#include "grouplin/error.hpp"
#include "layout/compiled_rules.hpp"

namespace grouplin {
namespace {

[[noreturn]] void invalid(const std::string& source, const std::string& what) {
  throw Error(ErrorCode::InvalidRules, "rules " + quote(source) + ": " + what);
}

std::string string_field(const nlohmann::json& j, const char* field, const std::string& source,
                         const std::string& where) {
  if (!j.contains(field)) invalid(source, where + " has no \"" + field + "\"");
  if (!j[field].is_string()) invalid(source, where + "." + field + " is not a string");
  return j[field].get<std::string>();
}

std::vector<std::string> string_list(const nlohmann::json& j, const char* field,
                                     const std::string& source, const std::string& where) {
  if (!j.contains(field)) invalid(source, where + " has no \"" + field + "\"");
  const nlohmann::json& v = j[field];
  if (!v.is_array() || v.empty()) {
    invalid(source, where + "." + field + " is not a non-empty array of strings");
  }
  std::vector<std::string> out;
  for (const auto& s : v) {
    if (!s.is_string()) invalid(source, where + "." + field + " holds a non-string");
    out.push_back(s.get<std::string>());
  }
  return out;
}

bool bool_field(const nlohmann::json& j, const char* field, const std::string& source,
                const std::string& where) {
  if (!j.contains(field)) return false;
  if (!j[field].is_boolean()) invalid(source, where + "." + field + " is not true or false");
  return j[field].get<bool>();
}

// Refuses any field of `j` not in `known` (listed in the message).
void only_fields(const nlohmann::json& j, std::initializer_list<std::string_view> known,
                 const std::string& source, const std::string& where) {
  for (const auto& [k, v] : j.items()) {
    if (std::find(known.begin(), known.end(), k) != known.end()) continue;
    std::string list;
    for (std::string_view f : known) list += (list.empty() ? "" : ", ") + std::string(f);
    invalid(source, where + " has unknown field " + quote(k) + " (" + list + ")");
  }
}

StackedTensorRule tensor_rule(const nlohmann::json& e, const std::string& source,
                              const std::string& where) {
  if (!e.is_object()) invalid(source, where + " is not an object");
  only_fields(e,
              {"stacked", "parts", "dims", "optional", "unit_dim", "transposed", "interleave",
               "folded", "scale_of", "blocks"},
              source, where);
  StackedTensorRule t;
  t.stacked = string_field(e, "stacked", source, where);
  t.parts = string_list(e, "parts", source, where);
  t.dims = string_list(e, "dims", source, where);
  t.optional = bool_field(e, "optional", source, where);
  t.unit_dim = bool_field(e, "unit_dim", source, where);
  t.transposed = bool_field(e, "transposed", source, where);
  t.folded = bool_field(e, "folded", source, where);
  if (e.contains("interleave")) {
    const nlohmann::json& v = e["interleave"];
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 64) {
      invalid(source, where + ".interleave is not an integer from 1 to 64");
    }
    t.interleave = v.get<int64_t>();
  }
  if (e.contains("scale_of")) t.scale_of = string_field(e, "scale_of", source, where);
  if (e.contains("blocks")) {
    const nlohmann::json& v = e["blocks"];
    if (!v.is_array()) invalid(source, where + ".blocks is not an array of block shapes");
    for (const nlohmann::json& b : v) {
      std::vector<int64_t> block;
      if (b.is_array()) {
        for (const nlohmann::json& d : b) {
          if (!d.is_number_integer()) block = {-1};  // refused by compile_rules
          if (d.is_number_integer()) block.push_back(d.get<int64_t>());
        }
      }
      if (!b.is_array()) block = {-1};
      t.blocks.push_back(std::move(block));
    }
  }
  return t;
}

}  // namespace

namespace layout {

CompiledRules compile_rules(const LayoutRules& r, const std::string& source) {
  if (r.tensors.empty()) invalid(source, "no tensors");
  if (r.tensors.front().optional) invalid(source, "tensors[0] is optional; the first is required");
  CompiledRules c;
  c.rules = r;
  std::string error;
  for (size_t i = 0; i < r.tensors.size(); ++i) {
    const StackedTensorRule& t = r.tensors[i];
    const std::string where = "tensors[" + std::to_string(i) + "]";
    std::optional<KeyPattern> stacked = KeyPattern::compile(t.stacked, false, error);
    if (!stacked) invalid(source, where + ".stacked " + quote(t.stacked) + " " + error);
    c.stacked.push_back(std::move(*stacked));
    if (t.parts.empty()) invalid(source, where + ".parts is empty");
    c.parts.emplace_back();
    for (const std::string& p : t.parts) {
      std::optional<KeyPattern> part = KeyPattern::compile(p, true, error);
      if (!part) invalid(source, where + ".parts " + quote(p) + " " + error);
      c.parts.back().push_back(std::move(*part));
    }
    if (t.dims.empty()) invalid(source, where + ".dims is empty");
    if (t.transposed && t.dims.size() != 2) {
      invalid(source, where + " is transposed but has " + std::to_string(t.dims.size()) +
                          " dims; a transpose needs two");
    }
    if (t.transposed && t.parts.size() != 1) {
      invalid(source, where + " is transposed but has " + std::to_string(t.parts.size()) +
                          " parts; a transposed tensor has one part");
    }
    if (t.interleave < 1) invalid(source, where + ".interleave is below 1");
    if (t.folded && (t.unit_dim || t.parts.size() != 1)) {
      invalid(source, where + " is folded; a folded tensor has one part and no unit dim");
    }
    if (t.interleave > 1 && t.parts.size() != 1) {
      invalid(source, where + " interleaves " + std::to_string(t.interleave) +
                          " groups of rows but has " + std::to_string(t.parts.size()) +
                          " parts; an interleaved tensor has one part");
    }
  }
  c.scale_of.assign(r.tensors.size(), -1);
  for (size_t i = 0; i < r.tensors.size(); ++i) {
    const StackedTensorRule& t = r.tensors[i];
    const std::string where = "tensors[" + std::to_string(i) + "]";
    if (t.scale_of.empty()) {
      if (!t.blocks.empty()) invalid(source, where + " has blocks but is no scale (scale_of)");
      continue;
    }
    for (size_t w = 0; w < r.tensors.size(); ++w) {
      if (w != i && r.tensors[w].stacked == t.scale_of && r.tensors[w].scale_of.empty()) {
        c.scale_of[i] = static_cast<int>(w);
      }
    }
    if (c.scale_of[i] < 0) {
      invalid(source, where + ".scale_of " + quote(t.scale_of) +
                          " is not the stacked name of another tensor of the set that is no scale");
    }
    const StackedTensorRule& weight = r.tensors[static_cast<size_t>(c.scale_of[i])];
    if (!t.optional) invalid(source, where + " is a scale but not optional (unquantized weights)");
    if (t.parts.size() != weight.parts.size()) {
      invalid(source, where + " has " + std::to_string(t.parts.size()) + " parts, its weight " +
                          std::to_string(weight.parts.size()) +
                          "; a scale has one part per part of its weight");
    }
    if (t.transposed || t.interleave > 1 || t.folded || t.unit_dim || weight.transposed ||
        weight.interleave > 1 || weight.folded) {
      invalid(source, where +
                          " is a scale, which is stored as its weight's blocks: it cannot "
                          "be (or scale a tensor) transposed, interleaved, folded or with a "
                          "unit dim");
    }
    if (t.blocks.empty()) invalid(source, where + " is a scale without blocks");
    for (const std::vector<int64_t>& b : t.blocks) {
      const bool ok = b.empty() || (b.size() == 2 && b[0] >= 1 && b[1] >= 1 &&
                                    b[0] <= (int64_t{1} << 30) && b[1] <= (int64_t{1} << 30));
      if (!ok) {
        invalid(source, where +
                            ".blocks holds a block that is neither [] (per tensor) nor two "
                            "sizes from 1 to 2^30");
      }
    }
  }
  for (const auto& [from, to] : r.renames) {
    if (from.empty() || to.empty() || from == "^") invalid(source, "a rename has an empty side");
    if (to.starts_with('^')) {
      invalid(source, "rename " + quote(from) + " -> " + quote(to) +
                          ": only its source may start with '^' (anchored at the key's start)");
    }
  }
  for (const JoinedTensors& jt : r.joins) {
    bool ok = !jt.whole.empty() && (jt.transposed ? jt.parts.size() == 1 : jt.parts.size() >= 2);
    for (const std::string& part : jt.parts) ok = ok && !part.empty() && part != jt.whole;
    if (!ok) {
      invalid(source, "join " + quote(jt.whole) +
                          ": a join needs a non-empty whole and at least two non-empty parts "
                          "(a transposed one exactly one), each other than the whole");
    }
  }
  bool any_folded = false;
  for (const StackedTensorRule& t : r.tensors) any_folded = any_folded || t.folded;
  if (any_folded != !r.experts_from.empty()) {
    invalid(source, any_folded ? "a tensor is folded but experts_from names no entry to count "
                                 "the experts by"
                               : "experts_from is set but no tensor is folded");
  }
  if (!r.experts_from.empty()) {
    c.experts_from = KeyPattern::compile(r.experts_from, false, error);
    if (!c.experts_from) invalid(source, "experts_from.key " + quote(r.experts_from) + " " + error);
  }
  if (!r.stacked_needs.empty()) {
    c.stacked_needs = KeyPattern::compile(r.stacked_needs, false, error);
    if (!c.stacked_needs) {
      invalid(source, "stacked_needs " + quote(r.stacked_needs) + " " + error);
    }
  }
  return c;
}

}  // namespace layout

LayoutRules parse_rules(std::string_view text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    invalid(source, "not JSON: " + detail::parser_text(e.what()));
  }
  if (!j.is_object()) invalid(source, "the document is not an object");
  only_fields(j,
              {"name", "renames", "renames_after", "joins", "tensors", "order", "per_expert",
               "stacked_needs", "prefix_ends_with", "experts_from", "grouped_linear_names"},
              source, "the document");
  LayoutRules r;
  r.name = string_field(j, "name", source, "the document");
  if (j.contains("order")) {
    const std::string order = string_field(j, "order", source, "the document");
    if (order != "expert-major" && order != "tensor-major") {
      invalid(source, "order " + quote(order) + " is not \"expert-major\" or \"tensor-major\"");
    }
    r.expert_major = order == "expert-major";
  }
  if (j.contains("per_expert")) {
    const std::string form = string_field(j, "per_expert", source, "the document");
    if (form != "native" && form != "te") {
      invalid(source, "per_expert " + quote(form) + " is not \"native\" or \"te\"");
    }
    r.per_expert = form == "te" ? PerExpertForm::TeOnly : PerExpertForm::Native;
  }
  if (j.contains("stacked_needs")) {
    r.stacked_needs = string_field(j, "stacked_needs", source, "the document");
  }
  r.grouped_linear_names = bool_field(j, "grouped_linear_names", source, "the document");
  if (j.contains("experts_from")) {
    const nlohmann::json& e = j["experts_from"];
    if (!e.is_object()) invalid(source, "experts_from is not an object");
    only_fields(e, {"key", "dim"}, source, "experts_from");
    r.experts_from = string_field(e, "key", source, "experts_from");
    if (e.contains("dim")) {
      if (!e["dim"].is_number_integer() || e["dim"].get<int64_t>() < 0 ||
          e["dim"].get<int64_t>() > 7) {
        invalid(source, "experts_from.dim is not an integer from 0 to 7");
      }
      r.experts_from_dim = e["dim"].get<int64_t>();
    }
  }
  if (j.contains("renames_after")) {
    r.renames_after = string_field(j, "renames_after", source, "the document");
  }
  if (j.contains("prefix_ends_with")) {
    r.prefix_ends_with = string_field(j, "prefix_ends_with", source, "the document");
    if (r.prefix_ends_with.empty() || r.prefix_ends_with.back() != '.') {
      invalid(source, "prefix_ends_with " + quote(r.prefix_ends_with) +
                          " is not text ending in '.' (a prefix ends in '.')");
    }
  }
  if (j.contains("renames")) {
    if (!j["renames"].is_array()) invalid(source, "renames is not an array");
    for (size_t i = 0; i < j["renames"].size(); ++i) {
      const nlohmann::json& e = j["renames"][i];
      const std::string where = "renames[" + std::to_string(i) + "]";
      if (!e.is_object()) invalid(source, where + " is not an object");
      only_fields(e, {"from", "to"}, source, where);
      r.renames.emplace_back(string_field(e, "from", source, where),
                             string_field(e, "to", source, where));
    }
  }
  if (j.contains("joins")) {
    if (!j["joins"].is_array()) invalid(source, "joins is not an array");
    for (size_t i = 0; i < j["joins"].size(); ++i) {
      const nlohmann::json& e = j["joins"][i];
      const std::string where = "joins[" + std::to_string(i) + "]";
      if (!e.is_object()) invalid(source, where + " is not an object");
      only_fields(e, {"whole", "parts", "transposed"}, source, where);
      r.joins.push_back({string_field(e, "whole", source, where),
                         string_list(e, "parts", source, where),
                         bool_field(e, "transposed", source, where)});
    }
  }
  if (!j.contains("tensors") || !j["tensors"].is_array()) {
    invalid(source, "tensors is missing or not an array");
  }
  for (size_t i = 0; i < j["tensors"].size(); ++i) {
    r.tensors.push_back(tensor_rule(j["tensors"][i], source, "tensors[" + std::to_string(i) + "]"));
  }
  // A GroupedLinear loads the entries of such a set as they are: they must be its names.
  if (r.grouped_linear_names &&
      (r.tensors.empty() || r.tensors[0].stacked != "{prefix}weight" ||
       r.tensors[0].parts != std::vector<std::string>{"{prefix}weight{expert}"} ||
       !r.renames.empty() || r.per_expert != PerExpertForm::Native)) {
    invalid(source,
            "grouped_linear_names is true, but the set's names are not GroupedLinear's: expected "
            "a first tensor \"{prefix}weight\" of parts [\"{prefix}weight{expert}\"], no renames "
            "and per_expert \"native\"");
  }
  layout::compile_rules(r, source);
  return r;
}

std::string rules_to_json(const LayoutRules& r) {
  nlohmann::ordered_json j;
  j["name"] = r.name;
  if (r.expert_major) j["order"] = "expert-major";
  if (r.per_expert == PerExpertForm::TeOnly) j["per_expert"] = "te";
  if (!r.stacked_needs.empty()) j["stacked_needs"] = r.stacked_needs;
  if (r.grouped_linear_names) j["grouped_linear_names"] = true;
  if (!r.prefix_ends_with.empty()) j["prefix_ends_with"] = r.prefix_ends_with;
  if (!r.experts_from.empty()) {
    j["experts_from"] = {{"key", r.experts_from}, {"dim", r.experts_from_dim}};
  }
  if (!r.renames.empty()) {
    j["renames"] = nlohmann::ordered_json::array();
    for (const auto& [from, to] : r.renames) j["renames"].push_back({{"from", from}, {"to", to}});
  }
  if (!r.renames_after.empty()) j["renames_after"] = r.renames_after;
  if (!r.joins.empty()) {
    j["joins"] = nlohmann::ordered_json::array();
    for (const JoinedTensors& jt : r.joins) {
      nlohmann::ordered_json e = {{"whole", jt.whole}, {"parts", jt.parts}};
      if (jt.transposed) e["transposed"] = true;
      j["joins"].push_back(e);
    }
  }
  j["tensors"] = nlohmann::ordered_json::array();
  for (const StackedTensorRule& t : r.tensors) {
    nlohmann::ordered_json e = {{"stacked", t.stacked}, {"parts", t.parts}, {"dims", t.dims}};
    if (t.optional) e["optional"] = true;
    if (t.unit_dim) e["unit_dim"] = true;
    if (t.transposed) e["transposed"] = true;
    if (t.interleave > 1) e["interleave"] = t.interleave;
    if (t.folded) e["folded"] = true;
    if (!t.scale_of.empty()) {
      e["scale_of"] = t.scale_of;
      e["blocks"] = t.blocks;
    }
    j["tensors"].push_back(std::move(e));
  }
  return j.dump(2);
}

LayoutRules load_rules(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorCode::IoError, "reading rules " + quote(path) + ": cannot open it");
  std::ostringstream text;
  text << f.rdbuf();
  return parse_rules(text.str(), path);
}

}  // namespace grouplin
