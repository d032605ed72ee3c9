// Reading a checkpoint directory's listing and index, and checking the index against the shards
// (see io/checkpoint_dir.hpp).
#include "io/checkpoints/checkpoint_dir.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "grouplin/error.hpp"

namespace grouplin::detail {
namespace {

namespace fs = std::filesystem;

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The whole file, refusing more than `limit` bytes. Throws Error(IoError), or `too_large`.
std::string read_small_file(const fs::path& p, uint64_t limit, ErrorCode too_large,
                            const std::string& context) {
  std::error_code ec;
  const uint64_t size = fs::file_size(p, ec);
  if (ec) throw Error(ErrorCode::IoError, context + ": " + ec.message());
  if (size > limit) {
    throw Error(too_large, context + ": " + std::to_string(size) + " bytes; expected at most " +
                               std::to_string(limit));
  }
  std::ifstream in(p, std::ios::binary);
  std::string text(std::istreambuf_iterator<char>(in), {});
  if (!in.good() && !in.eof()) throw Error(ErrorCode::IoError, context + ": cannot read the file");
  return text;
}

// config.json's model_type, "" when there is no such file or it says none.
std::string read_model_type(const fs::path& dir) {
  const fs::path p = dir / "config.json";
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return "";
  try {
    const nlohmann::json j = nlohmann::json::parse(
        read_small_file(p, uint64_t{16} << 20, ErrorCode::IoError, "reading config.json"));
    if (j.is_object() && j.contains("model_type") && j["model_type"].is_string()) {
      return j["model_type"].get<std::string>();
    }
  } catch (const std::exception&) {
    // A config that is no JSON names no family: detection then works from the keys alone.
  }
  return "";
}

}  // namespace

const char* unsafe_relative_path(std::string_view name) {
  if (name.empty()) return "is empty";
  if (name.find('\0') != std::string_view::npos) return "holds a NUL byte";
  if (name.front() == '/') return "is absolute";
  size_t begin = 0;
  while (begin <= name.size()) {
    const size_t end = std::min(name.find('/', begin), name.size());
    const std::string_view part = name.substr(begin, end - begin);
    if (part.empty()) return "has an empty component";
    if (part == ".") return "has a \".\" component";
    if (part == "..") return "has a \"..\" component (it climbs out of the directory)";
    begin = end + 1;
  }
  return nullptr;
}

bool is_weight_file_name(std::string_view name) {
  const size_t slash = name.rfind('/');
  if (slash != std::string_view::npos) name = name.substr(slash + 1);
  return ends_with(name, ".safetensors") || ends_with(name, ".pt") || ends_with(name, ".pth") ||
         ends_with(name, ".safetensors.index.json") || ends_with(name, ".bin.index.json") ||
         (name.rfind("pytorch_model", 0) == 0 && ends_with(name, ".bin"));
}

std::string CheckpointDir::file(const std::string& relative) const {
  return (fs::path(path) / relative).string();
}

CheckpointDir read_checkpoint_dir(const std::string& path) {
  const std::string context = "reading the checkpoint directory " + quote(path);
  CheckpointDir d;
  d.path = path;
  std::error_code ec;
  // A Hugging Face cache folder (hub/models--org--name): the snapshot refs/main names.
  if (fs::is_regular_file(fs::path(path) / "refs" / "main", ec) &&
      fs::is_directory(fs::path(path) / "snapshots", ec)) {
    std::string rev = read_small_file(fs::path(path) / "refs" / "main", 4096,
                                      ErrorCode::InvalidIndex, context + ": refs/main");
    while (!rev.empty() && std::isspace(static_cast<unsigned char>(rev.back()))) rev.pop_back();
    if (const char* why = unsafe_relative_path(rev);
        why != nullptr || rev.find('/') != std::string::npos) {
      throw Error(ErrorCode::UnsafePath,
                  context + ": a Hugging Face cache folder whose refs/main " + quote(rev) +
                      " is not a revision (" + (why ? why : "has a \"/\"") + ")");
    }
    d.snapshot = "snapshots/" + rev;
    d.path = (fs::path(path) / d.snapshot).string();
    if (!fs::is_directory(d.path, ec)) {
      throw Error(ErrorCode::IoError,
                  context + ": a Hugging Face cache folder whose refs/main names the snapshot " +
                      quote(rev) + ", which is not in snapshots/ (a download not finished?)");
    }
  }
  const fs::path root(d.path);

  for (CheckpointFormat f : {CheckpointFormat::Safetensors, CheckpointFormat::Pt}) {
    const std::string name = shard_index_file_name(f);
    if (fs::is_regular_file(root / name, ec)) {
      d.index_file = name;
      break;
    }
  }
  if (!d.index_file.empty()) {
    const std::string index_context = "reading " + quote((root / d.index_file).string());
    d.index = parse_shard_index(read_small_file(root / d.index_file, kMaxShardIndexSize,
                                                ErrorCode::InvalidIndex, index_context),
                                index_context);
    for (const auto& [key, file] : d.index.weight_map) d.shards.push_back(file);
    std::sort(d.shards.begin(), d.shards.end());
    d.shards.erase(std::unique(d.shards.begin(), d.shards.end()), d.shards.end());
    for (const std::string& shard : d.shards) {
      const fs::file_status st = fs::status(root / shard, ec);  // follows links
      if (!fs::is_regular_file(st)) {
        throw Error(ErrorCode::ShardMissing,
                    index_context + ": the shard " + quote(shard) +
                        (fs::exists(st) ? " is not a regular file" : " does not exist") +
                        "; expected the file the index names for its tensors");
      }
    }
  }

  // Everything else in the directory: shards when there is no index, other files to copy.
  std::vector<std::string> safetensors_files;
  std::vector<std::string> pt_files;  // top-level pytorch_model.bin, *.pt, *.pth
  fs::recursive_directory_iterator it(root, fs::directory_options::none, ec);
  if (ec) throw Error(ErrorCode::IoError, context + ": " + ec.message());
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) throw Error(ErrorCode::IoError, context + ": " + ec.message());
    const std::string rel = it->path().lexically_relative(root).generic_string();
    const fs::file_status st = fs::status(it->path(), ec);  // follows links
    if (fs::is_directory(st)) {
      if (it->is_symlink()) d.skipped.push_back(rel);  // never followed: it could loop
      continue;
    }
    if (!fs::is_regular_file(st)) {
      d.skipped.push_back(rel);
      continue;
    }
    if (rel == d.index_file || std::binary_search(d.shards.begin(), d.shards.end(), rel)) continue;
    if (d.index_file.empty() && it.depth() == 0 && ends_with(rel, ".safetensors")) {
      safetensors_files.push_back(rel);
    } else if (d.index_file.empty() && it.depth() == 0 && is_weight_file_name(rel) &&
               !ends_with(rel, ".json")) {
      pt_files.push_back(rel);
    } else if (is_weight_file_name(rel)) {
      d.skipped.push_back(rel);
    } else {
      d.other_files.push_back(rel);
    }
  }
  std::sort(pt_files.begin(), pt_files.end());
  if (d.index_file.empty() && safetensors_files.empty() && pt_files.size() == 1) {
    // A model saved whole as one pickle (save_pretrained(safe_serialization=False) of a model
    // under its shard size: pytorch_model.bin without an index; model.pt): its only shard.
    safetensors_files = std::move(pt_files);
    pt_files.clear();
  }
  if (d.index_file.empty()) {
    if (safetensors_files.empty()) {
      std::string several;
      for (const std::string& f : pt_files) several += (several.empty() ? "" : ", ") + quote(f);
      throw Error(
          ErrorCode::UnknownFormat,
          context + ": no " + shard_index_file_name(CheckpointFormat::Safetensors) + ", no " +
              shard_index_file_name(CheckpointFormat::Pt) + ", no *.safetensors file" +
              (pt_files.empty() ? std::string(" and no single pytorch_model.bin, *.pt or *.pth")
                                : " and several .pt / .bin files without an index (" + several +
                                      "): which are shards of one model is unknown; convert one "
                                      "file at a time") +
              "; expected a Hugging Face model directory");
    }
    d.shards = std::move(safetensors_files);
    std::sort(d.shards.begin(), d.shards.end());
  }
  d.skipped.insert(d.skipped.end(), pt_files.begin(), pt_files.end());
  std::sort(d.other_files.begin(), d.other_files.end());
  std::sort(d.skipped.begin(), d.skipped.end());
  d.model_type = read_model_type(root);
  return d;
}

std::vector<Problem> check_shard_contents(const CheckpointDir& dir,
                                          const std::vector<ShardTensors>& contents) {
  const std::string context = "reading the checkpoint directory " + quote(dir.path);
  std::unordered_map<std::string_view, size_t> shard_of;  // tensor -> its shard
  uint64_t total = 0;
  for (size_t k = 0; k < contents.size(); ++k) {
    for (const auto& [name, nbytes] : contents[k]) {
      auto [it, fresh] = shard_of.emplace(name, k);
      if (!fresh) {
        throw Error(ErrorCode::DuplicateName,
                    context + ": the tensor " + quote(name) + " is in two shards, " +
                        quote(dir.shards[it->second]) + " and " + quote(dir.shards[k]) +
                        "; expected each tensor in one shard");
      }
      total += nbytes;
    }
  }
  if (dir.index_file.empty()) return {};

  const std::string index = quote(dir.index_file);
  std::unordered_map<std::string_view, std::string_view> listed;  // tensor -> shard, per index
  for (const auto& [key, file] : dir.index.weight_map) listed.emplace(key, file);
  for (size_t k = 0; k < contents.size(); ++k) {
    for (const auto& [name, nbytes] : contents[k]) {
      auto it = listed.find(name);
      if (it == listed.end()) {
        throw Error(ErrorCode::TensorNotInIndex,
                    context + ": the shard " + quote(dir.shards[k]) + " holds the tensor " +
                        quote(name) + ", which " + index +
                        " does not name; expected every tensor in the index");
      }
    }
  }
  for (const auto& [key, file] : dir.index.weight_map) {
    auto it = shard_of.find(key);
    if (it == shard_of.end() || dir.shards[it->second] != file) {
      throw Error(ErrorCode::TensorNotInShard,
                  context + ": " + index + " puts the tensor " + quote(key) + " in " + quote(file) +
                      ", which does not hold it" +
                      (it == shard_of.end() ? "; no shard does"
                                            : "; it is in " + quote(dir.shards[it->second])));
    }
  }
  // Only a warning: transformers never reads the field (some uploads count file bytes, or a
  // dtype's bytes before quantization), and a reader needs nothing from it.
  std::vector<Problem> warnings;
  if (dir.index.total_size && *dir.index.total_size != total) {
    warnings.push_back({ErrorCode::TotalSizeMismatch, dir.index_file,
                        context + ": " + index + " gives total_size " +
                            std::to_string(*dir.index.total_size) +
                            ", but the tensors of its shards hold " + std::to_string(total) +
                            " bytes; the field is ignored"});
  }
  return warnings;
}

}  // namespace grouplin::detail
