// The pieces of the sharded-checkpoint format (see grouplin/sharded_checkpoint.hpp): the index
// file, shard names, Hugging Face's sharding rule and its size notation.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "core/parser_text.hpp"
#include "grouplin/error.hpp"
#include "grouplin/sharded_checkpoint.hpp"
#include "io/checkpoints/checkpoint_dir.hpp"

namespace grouplin {
namespace {

using Json = nlohmann::json;

// An index is three levels deep (the object, weight_map, its strings); metadata may hold more,
// but nothing a reader needs is deeper than this.
constexpr int kMaxIndexDepth = 16;

// Parses `text`, refusing duplicate keys at any level (nlohmann keeps the last one) and nesting
// past kMaxIndexDepth. Throws Error(InvalidIndex) or Error(DuplicateName).
Json parse_strict(std::string_view text, const std::string& context) {
  std::vector<std::set<std::string>> keys;  // of each open object
  std::string duplicate;
  bool too_deep = false;
  auto callback = [&](int depth, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        keys.emplace_back();
        [[fallthrough]];
      case Json::parse_event_t::array_start:
        if (depth >= kMaxIndexDepth) too_deep = true;
        break;
      case Json::parse_event_t::object_end:
        keys.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!keys.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default:
        break;
    }
    return !too_deep;
  };
  Json j;
  try {
    j = Json::parse(text.begin(), text.end(), callback);
  } catch (const Json::exception& e) {
    throw Error(ErrorCode::InvalidIndex,
                context + ": not JSON (" + detail::parser_text(e.what()) + ")");
  }
  if (too_deep) {
    throw Error(ErrorCode::InvalidIndex,
                context + ": nested deeper than " + std::to_string(kMaxIndexDepth) + " levels");
  }
  if (!duplicate.empty()) {
    throw Error(ErrorCode::DuplicateName, context + ": the key " + quote(duplicate) +
                                              " appears twice; expected each key once");
  }
  return j;
}

std::optional<uint64_t> count_field(const Json& metadata, const char* field,
                                    const std::string& context) {
  if (!metadata.contains(field)) return std::nullopt;
  const Json& v = metadata[field];
  if (!v.is_number_unsigned()) {
    throw Error(ErrorCode::InvalidIndex, context + ": metadata." + field + " is " +
                                             detail::parser_text(v.dump()) +
                                             "; expected an integer >= 0");
  }
  return v.get<uint64_t>();
}

// 10^k or 2^(10k) for the unit suffix `unit` (without the number); 0 when it is no unit. Binary
// units are read in any case ("GiB", "gib", "GIB"), as transformers reads them; a decimal unit
// with a lower-case b never gets here (parse_byte_size refuses it first).
uint64_t unit_multiplier(std::string_view unit) {
  if (unit.empty() || unit == "B") return 1;
  auto upper = [](char c) { return static_cast<char>(c & ~0x20); };  // for ASCII letters
  if (unit.size() < 2 || unit.size() > 3 || upper(unit.back()) != 'B') return 0;
  const char prefix = upper(unit[0]);
  const int power = prefix == 'K'   ? 1
                    : prefix == 'M' ? 2
                    : prefix == 'G' ? 3
                    : prefix == 'T' ? 4
                                    : 0;
  if (power == 0) return 0;
  if (unit.size() == 3 && upper(unit[1]) != 'I') return 0;
  const uint64_t base = unit.size() == 3 ? 1024 : 1000;
  uint64_t m = 1;
  for (int i = 0; i < power; ++i) m *= base;
  return m;
}

}  // namespace

ShardIndex parse_shard_index(std::string_view json, const std::string& context) {
  const Json j = parse_strict(json, context);
  if (!j.is_object()) {
    throw Error(ErrorCode::InvalidIndex,
                context + ": the index is " + std::string(j.type_name()) + "; expected an object");
  }
  ShardIndex index;
  if (j.contains("metadata")) {
    const Json& m = j["metadata"];
    if (!m.is_object()) {
      throw Error(ErrorCode::InvalidIndex, context + ": \"metadata\" is " +
                                               std::string(m.type_name()) + "; expected an object");
    }
    index.total_size = count_field(m, "total_size", context);
    index.total_parameters = count_field(m, "total_parameters", context);
  }
  if (!j.contains("weight_map") || !j["weight_map"].is_object()) {
    throw Error(ErrorCode::InvalidIndex,
                context + ": " +
                    (j.contains("weight_map")
                         ? "\"weight_map\" is " + std::string(j["weight_map"].type_name())
                         : std::string("no \"weight_map\"")) +
                    "; expected an object mapping each tensor to its shard file");
  }
  for (const auto& [key, file] : j["weight_map"].items()) {
    if (!file.is_string()) {
      throw Error(ErrorCode::InvalidIndex, context + ": weight_map[" + quote(key) + "] is " +
                                               std::string(file.type_name()) +
                                               "; expected a shard file name");
    }
    std::string name = file.get<std::string>();
    if (const char* why = detail::unsafe_relative_path(name)) {
      throw Error(ErrorCode::UnsafePath, context + ": tensor " + quote(key) + " is in " +
                                             quote(name) + ", which " + why +
                                             "; expected a file name inside the directory");
    }
    index.weight_map.emplace_back(key, std::move(name));  // items() of an object: sorted by key
  }
  return index;
}

std::string shard_index_json(const ShardIndex& index) {
  Json metadata = Json::object();
  if (index.total_parameters) metadata["total_parameters"] = *index.total_parameters;
  if (index.total_size) metadata["total_size"] = *index.total_size;
  Json map = Json::object();
  for (const auto& [key, file] : index.weight_map) map[key] = file;
  Json j = {{"metadata", std::move(metadata)}, {"weight_map", std::move(map)}};
  // Python's json.dumps escapes every non-ASCII character (ensure_ascii=True), as does this.
  return j.dump(2, ' ', /*ensure_ascii=*/true) + "\n";
}

std::vector<std::vector<size_t>> plan_shards(std::span<const uint64_t> sizes,
                                             uint64_t max_shard_size) {
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> current;
  uint64_t current_size = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] > max_shard_size) {
      shards.push_back({i});
      continue;
    }
    if (!current.empty() && sizes[i] > max_shard_size - current_size) {
      shards.push_back(std::move(current));
      current.clear();
      current_size = 0;
    }
    current.push_back(i);
    current_size += sizes[i];
  }
  if (!current.empty()) shards.push_back(std::move(current));
  return shards;
}

std::string shard_file_name(CheckpointFormat format, size_t index, size_t count) {
  const bool pt = format == CheckpointFormat::Pt;
  const char* stem = pt ? "pytorch_model" : "model";
  const char* ext = pt ? ".bin" : ".safetensors";
  if (count == 1) return std::string(stem) + ext;
  char suffix[64];
  std::snprintf(suffix, sizeof suffix, "-%05zu-of-%05zu", index + 1, count);
  return std::string(stem) + suffix + ext;
}

std::string shard_index_file_name(CheckpointFormat format) {
  return format == CheckpointFormat::Pt ? "pytorch_model.bin.index.json"
                                        : "model.safetensors.index.json";
}

uint64_t parse_byte_size(std::string_view text) {
  const std::string bad = "the size " + quote(text);
  const char* expected =
      "; expected a number of bytes, optionally with a unit: B, KB, MB, GB, TB (powers of 1000, "
      "upper-case B) or KiB, MiB, GiB, TiB (powers of 1024, any case), as in 5GB or 500MB";
  size_t i = 0;
  uint64_t whole = 0, frac = 0, frac_scale = 1;
  bool digits = false;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i, digits = true) {
    if (whole > (UINT64_MAX - 9) / 10)
      throw Error(ErrorCode::InvalidArgument, bad + " is too large");
    whole = whole * 10 + static_cast<uint64_t>(text[i] - '0');
  }
  if (i < text.size() && text[i] == '.') {
    for (++i; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i, digits = true) {
      if (frac_scale < 1'000'000'000'000ull) {  // digits past 12 decimals do not change bytes
        frac = frac * 10 + static_cast<uint64_t>(text[i] - '0');
        frac_scale *= 10;
      }
    }
  }
  const std::string_view unit = text.substr(i);
  // transformers reads "5gb" and "5Gb" as gigabits (an eighth of 5GB); "5gib" is 5 GiB to it.
  if (unit.size() == 2 && unit.back() == 'b') {
    throw Error(ErrorCode::InvalidArgument,
                bad + " is ambiguous (a lower-case b means bits to transformers); write it with B" +
                    expected);
  }
  const uint64_t m = unit_multiplier(unit);
  if (!digits || m == 0) throw Error(ErrorCode::InvalidArgument, bad + expected);
  if (whole > UINT64_MAX / m) throw Error(ErrorCode::InvalidArgument, bad + " is past 2^64 bytes");
  // The fraction in bytes, floored: frac / frac_scale * m, without overflow for m <= 2^40.
  const unsigned __int128 part = static_cast<unsigned __int128>(frac) * m / frac_scale;
  const unsigned __int128 total = static_cast<unsigned __int128>(whole) * m + part;
  if (total > UINT64_MAX) throw Error(ErrorCode::InvalidArgument, bad + " is past 2^64 bytes");
  if (total == 0)
    throw Error(ErrorCode::InvalidArgument, bad + " is zero; expected at least 1 byte");
  return static_cast<uint64_t>(total);
}

}  // namespace grouplin
