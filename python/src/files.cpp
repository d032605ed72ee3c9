// Checkpoint files from Python: load, save, inspect, convert, verify. Each releases the
// interpreter lock while GroupLin works, so other Python threads run meanwhile (and these
// functions may run on several threads at once: the library's free functions share no state).

#include <algorithm>
#include <cstdint>
#include <map>

#include "bindings.hpp"
#include "grouplin/checkpoint.hpp"
#include "grouplin/compare.hpp"
#include "grouplin/convert.hpp"
#include "grouplin/error.hpp"
#include "grouplin/inspect.hpp"
#include "grouplin/sharded_checkpoint.hpp"

namespace grouplin::python {
namespace {

std::optional<CheckpointFormat> format_from_name(const std::optional<std::string>& name) {
  if (!name) return std::nullopt;
  if (*name == "safetensors") return CheckpointFormat::Safetensors;
  if (*name == "pt") return CheckpointFormat::Pt;
  throw Error(ErrorCode::InvalidArgument,
              "format " + quote(*name) + ": expected \"safetensors\", \"pt\" or None");
}

nb::list problems_list(const std::vector<Problem>& problems) {
  nb::list out;
  for (const Problem& p : problems) {
    out.append(nb::make_tuple(std::string(error_code_name(p.code)), p.key, p.message));
  }
  return out;
}

nb::dict load(const std::string& path, const std::string& framework_name) {
  const Framework framework = framework_from_name(framework_name);
  // torch has no read-only tensors: its arrays view a private copy-on-write mapping, so that a
  // write changes this process's pages and never the file.
  const MapMode mode = framework == Framework::Torch ? MapMode::CopyOnWrite : MapMode::ReadOnly;
  Checkpoint c;
  {
    nb::gil_scoped_release unlocked;
    c = load_checkpoint(path, mode);
  }
  nb::dict out;
  out["tensors"] = arrays_from_state_dict(c.tensors, framework);
  nb::dict metadata;
  for (const auto& [k, v] : c.metadata) metadata[nb::str(k.c_str(), k.size())] = v;
  out["metadata"] = metadata;
  out["format"] = std::string(format_name(c.format));
  out["model_type"] = c.model_type;
  out["shards"] = c.shards;
  out["warnings"] = problems_list(c.warnings);
  return out;
}

void save(const std::string& path, const std::vector<std::string>& names,
          const std::vector<InArray>& arrays, const std::vector<std::optional<std::string>>& dtypes,
          const std::optional<std::string>& format,
          const std::map<std::string, std::string>& metadata) {
  const StateDict tensors = state_dict_from_arrays(names, arrays, dtypes);
  const std::optional<CheckpointFormat> f = format_from_name(format);
  nb::gil_scoped_release unlocked;
  save_checkpoint(path, tensors, f, metadata);
}

std::string inspect(const std::string& path, const std::vector<std::string>& rules,
                    const std::string& model_type, const std::string& state_dict_key) {
  const std::vector<LayoutRules> sets = rules_from_names(rules);
  nb::gil_scoped_release unlocked;
  return inspect_json(inspect_checkpoint(path, sets, model_type, state_dict_key), path);
}

std::string convert(const std::string& in, const std::string& out, const std::string& layout,
                    const std::optional<std::string>& format, const std::vector<std::string>& rules,
                    const std::optional<std::pair<int64_t, int64_t>>& experts,
                    const std::optional<uint64_t>& max_shard_size, bool force,
                    const std::optional<nb::callable>& progress,
                    const std::optional<std::string>& dtype, const std::string& model_type,
                    const std::string& state_dict_key) {
  ConvertOptions o;
  o.state_dict_key = state_dict_key;
  const std::optional<ExpertLayout> l = expert_layout_from_name(layout);
  if (!l && layout != "keep") {
    throw Error(ErrorCode::InvalidArgument,
                "layout " + quote(layout) + ": expected \"single\", \"per-expert\" or \"keep\"");
  }
  o.layout = l;
  o.format = format_from_name(format);
  o.rules = rules_from_names(rules);
  o.model_type = model_type;
  if (experts) o.experts = ExpertRange{experts->first, experts->second};
  o.max_shard_size = max_shard_size;
  o.overwrite = force;
  if (dtype) {
    const std::optional<DType> t = dtype_from_name(*dtype);
    if (!t || (*t != DType::F32 && *t != DType::BF16 && *t != DType::F16)) {
      throw Error(ErrorCode::UnsupportedDType,
                  "dtype " + quote(*dtype) + ": expected \"F32\", \"BF16\" or \"F16\"");
    }
    o.dtype = *t;
  }
  // At each progress point (every 16 MiB): Ctrl-C (KeyboardInterrupt) stops the conversion,
  // leaving OUT as it was, as in the command line; then the caller's callback, if any.
  o.progress = [&progress](uint64_t done, uint64_t total) {
    nb::gil_scoped_acquire locked;
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
    if (progress) (*progress)(done, total);
  };
  ConvertReport r;
  {
    nb::gil_scoped_release unlocked;
    r = convert_checkpoint(in, out, o);
  }
  return convert_report_json(r, in, out);
}

std::string verify(const std::string& a, const std::string& b, size_t max_listed,
                   const std::vector<std::string>& rules, const std::string& model_type,
                   const std::string& state_dict_key) {
  CompareOptions o;
  o.state_dict_key = state_dict_key;
  o.max_listed = max_listed;
  o.rules = rules_from_names(rules);
  o.model_type = model_type;
  CompareReport r;
  {
    nb::gil_scoped_release unlocked;
    r = compare_checkpoints(a, b, o);
  }
  return compare_report_json(r, a, b);
}

}  // namespace

std::vector<LayoutRules> rules_from_names(const std::vector<std::string>& names) {
  const std::vector<std::string> builtins = builtin_rule_names();
  std::vector<LayoutRules> out;
  for (const std::string& name : names) {
    const bool builtin = std::find(builtins.begin(), builtins.end(), name) != builtins.end();
    out.push_back(builtin ? builtin_rules(name) : load_rules(name));
  }
  return out;
}

StateDict state_dict_from_arrays(const std::vector<std::string>& names,
                                 const std::vector<InArray>& arrays,
                                 const std::vector<std::optional<std::string>>& dtypes) {
  if (names.size() != arrays.size() || names.size() != dtypes.size()) {
    throw Error(ErrorCode::InvalidArgument, "tensors: " + std::to_string(names.size()) +
                                                " names, " + std::to_string(arrays.size()) +
                                                " arrays and " + std::to_string(dtypes.size()) +
                                                " dtypes; expected one of each per tensor");
  }
  StateDict out;
  for (size_t i = 0; i < names.size(); ++i) {
    out.insert(names[i], tensor_from_array(arrays[i], dtypes[i], "tensor " + quote(names[i])));
  }
  return out;
}

nb::list arrays_from_state_dict(const StateDict& tensors, Framework framework) {
  nb::list out;
  for (const auto& [name, t] : tensors) {
    out.append(nb::make_tuple(nb::str(name.c_str(), name.size()),
                              std::string(dtype_name(t.dtype())), array_from_tensor(t, framework)));
  }
  return out;
}

void bind_files(nb::module_& m) {
  m.def("load", &load, nb::arg("path"), nb::arg("framework"),
        "Loads a checkpoint file or sharded directory: a dict of tensors (name, dtype, array), "
        "metadata, format, model_type, shards and warnings.");
  m.def("save", &save, nb::arg("path"), nb::arg("names"), nb::arg("arrays"), nb::arg("dtypes"),
        nb::arg("format").none(), nb::arg("metadata"),
        "Writes the arrays as one checkpoint file, atomically.");
  m.def("inspect", &inspect, nb::arg("path"), nb::arg("rules"), nb::arg("model_type"),
        nb::arg("state_dict_key"), "The document of `grouplin inspect --json`, as JSON text.");
  m.def("convert", &convert, nb::arg("src"), nb::arg("dst"), nb::arg("layout"),
        nb::arg("format").none(), nb::arg("rules"), nb::arg("experts").none(),
        nb::arg("max_shard_size").none(), nb::arg("force"), nb::arg("progress").none(),
        nb::arg("dtype").none(), nb::arg("model_type"), nb::arg("state_dict_key"),
        "Converts a checkpoint's grouped modules to one layout, streaming; the report as a dict.");
  m.def("verify", &verify, nb::arg("a"), nb::arg("b"), nb::arg("max_listed"), nb::arg("rules"),
        nb::arg("model_type"), nb::arg("state_dict_key"),
        "Compares two checkpoints' values whatever their layouts.");
  m.def("rule_names", &builtin_rule_names, "The built-in rule sets' names.");
  m.def(
      "parse_byte_size", [](const std::string& text) { return parse_byte_size(text); },
      nb::arg("text"), "Bytes of a size such as \"5GB\" or \"500MiB\" (as --max-shard-size).");
  m.def(
      "data_address",
      [](const InArray& array, const std::optional<std::string>& dtype) {
        const Tensor t = tensor_from_array(array, dtype, "array");
        return reinterpret_cast<uintptr_t>(t.data());
      },
      nb::arg("array"), nb::arg("dtype").none() = nb::none(),
      "The address of the bytes GroupLin sees for this array (equal to the array's own: no copy).");
}

}  // namespace grouplin::python
