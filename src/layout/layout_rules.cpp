// The built-in rule sets and the JSON form of user rules (include/grouplin/layout_rules.hpp).
#include "grouplin/layout_rules.hpp"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/parser_text.hpp"
#include "grouplin/error.hpp"
#include "layout/key_pattern.hpp"

namespace grouplin {
namespace {

// transformers v5 fused experts: gate and up concatenated, down alone, FP8 scales alike.
LayoutRules fused_hf(std::string name, std::string_view gate, std::string_view up,
                     std::string_view down) {
  auto part = [](std::string_view proj, std::string_view leaf) {
    std::string p = "{prefix}{expert}.";
    p += proj;
    p += '.';
    p += leaf;
    return p;
  };
  LayoutRules r;
  r.name = std::move(name);
  r.expert_major = true;
  r.tensors = {
      {"{prefix}gate_up_proj", {part(gate, "weight"), part(up, "weight")}, {"inter", "hidden"}},
      {"{prefix}down_proj", {part(down, "weight")}, {"hidden", "inter"}},
      {"{prefix}gate_up_proj_scale_inv",
       {part(gate, "weight_scale_inv"), part(up, "weight_scale_inv")},
       {"inter_blocks", "hidden_blocks"},
       true},
      {"{prefix}down_proj_scale_inv",
       {part(down, "weight_scale_inv")},
       {"hidden_blocks", "inter_blocks"},
       true},
  };
  return r;
}

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

// The checks parse_rules promises, shared by the built-in sets (a test runs them on each).
void check_rules(const LayoutRules& r, const std::string& source) {
  if (r.tensors.empty()) invalid(source, "no tensors");
  if (r.tensors.front().optional) invalid(source, "tensors[0] is optional; the first is required");
  for (size_t i = 0; i < r.tensors.size(); ++i) {
    const StackedTensorRule& t = r.tensors[i];
    const std::string where = "tensors[" + std::to_string(i) + "]";
    std::string error;
    if (!layout::KeyPattern::compile(t.stacked, false, error)) {
      invalid(source, where + ".stacked " + quote(t.stacked) + " " + error);
    }
    if (t.parts.empty()) invalid(source, where + ".parts is empty");
    for (const std::string& p : t.parts) {
      if (!layout::KeyPattern::compile(p, true, error)) {
        invalid(source, where + ".parts " + quote(p) + " " + error);
      }
    }
    if (t.dims.empty()) invalid(source, where + ".dims is empty");
  }
  for (const auto& [from, to] : r.renames) {
    if (from.empty() || to.empty()) invalid(source, "a rename has an empty side");
  }
}

}  // namespace

std::vector<std::string> builtin_rule_names() { return {"te", "hf", "hf-w1w3", "hf-mixtral"}; }

namespace {
LayoutRules builtin_rules_unchecked(std::string_view name);
}  // namespace

LayoutRules builtin_rules(std::string_view name) {
  LayoutRules r = builtin_rules_unchecked(name);
  check_rules(r, "built-in " + r.name);
  return r;
}

namespace {
LayoutRules builtin_rules_unchecked(std::string_view name) {
  if (name == "te") {
    LayoutRules r;
    r.name = "te";
    r.tensors = {
        {"{prefix}weight", {"{prefix}weight{expert}"}, {"out", "in"}},
        {"{prefix}bias", {"{prefix}bias{expert}"}, {"out"}, true, true},
    };
    return r;
  }
  if (name == "hf") return fused_hf("hf", "gate_proj", "up_proj", "down_proj");
  if (name == "hf-w1w3") return fused_hf("hf-w1w3", "w1", "w3", "w2");
  if (name == "hf-mixtral") {
    LayoutRules r = fused_hf("hf-mixtral", "w1", "w3", "w2");
    r.renames = {{".block_sparse_moe.", ".mlp."}};
    return r;
  }
  std::string known;
  for (const std::string& n : builtin_rule_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error(ErrorCode::InvalidArgument,
              "layout rules " + quote(name) + ": no such built-in set (known: " + known + ")");
}
}  // namespace

std::optional<std::string> rules_for_model_type(std::string_view model_type) {
  // transformers v5's conversion mapping, by the names its model families use.
  for (std::string_view t : {"mixtral", "minimax"}) {
    if (model_type == t) return "hf-mixtral";
  }
  for (std::string_view t : {"phimoe", "lfm2_moe"}) {
    if (model_type == t) return "hf-w1w3";
  }
  for (std::string_view t :
       {"qwen2_moe", "qwen3_moe", "qwen3_next", "qwen3_omni_moe", "qwen3_vl_moe", "olmoe",
        "flex_olmo", "deepseek_v2", "deepseek_v3", "dots1", "ernie4_5_moe", "glm4_moe", "glm4v_moe",
        "hunyuan_v1_moe", "longcat_flash", "jamba"}) {
    if (model_type == t) return "hf";
  }
  return std::nullopt;
}

LayoutRules parse_rules(std::string_view text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    invalid(source, "not JSON: " + detail::parser_text(e.what()));
  }
  if (!j.is_object()) invalid(source, "the document is not an object");
  for (const auto& [k, v] : j.items()) {
    if (k != "name" && k != "renames" && k != "tensors" && k != "order") {
      invalid(source, "unknown field " + quote(k) + " (name, renames, tensors, order)");
    }
  }
  LayoutRules r;
  r.name = string_field(j, "name", source, "the document");
  if (j.contains("order")) {
    const std::string order = string_field(j, "order", source, "the document");
    if (order != "expert-major" && order != "tensor-major") {
      invalid(source, "order " + quote(order) + " is not \"expert-major\" or \"tensor-major\"");
    }
    r.expert_major = order == "expert-major";
  }
  if (j.contains("renames")) {
    if (!j["renames"].is_array()) invalid(source, "renames is not an array");
    for (size_t i = 0; i < j["renames"].size(); ++i) {
      const nlohmann::json& e = j["renames"][i];
      const std::string where = "renames[" + std::to_string(i) + "]";
      if (!e.is_object()) invalid(source, where + " is not an object");
      r.renames.emplace_back(string_field(e, "from", source, where),
                             string_field(e, "to", source, where));
    }
  }
  if (!j.contains("tensors") || !j["tensors"].is_array()) {
    invalid(source, "tensors is missing or not an array");
  }
  for (size_t i = 0; i < j["tensors"].size(); ++i) {
    const nlohmann::json& e = j["tensors"][i];
    const std::string where = "tensors[" + std::to_string(i) + "]";
    if (!e.is_object()) invalid(source, where + " is not an object");
    for (const auto& [k, v] : e.items()) {
      if (k != "stacked" && k != "parts" && k != "dims" && k != "optional" && k != "unit_dim") {
        invalid(source, where + " has unknown field " + quote(k) +
                            " (stacked, parts, dims, optional, unit_dim)");
      }
    }
    StackedTensorRule t;
    t.stacked = string_field(e, "stacked", source, where);
    t.parts = string_list(e, "parts", source, where);
    t.dims = string_list(e, "dims", source, where);
    t.optional = bool_field(e, "optional", source, where);
    t.unit_dim = bool_field(e, "unit_dim", source, where);
    r.tensors.push_back(std::move(t));
  }
  check_rules(r, source);
  return r;
}

LayoutRules load_rules(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorCode::IoError, "reading rules " + quote(path) + ": cannot open it");
  std::ostringstream text;
  text << f.rdbuf();
  return parse_rules(text.str(), path);
}

}  // namespace grouplin
