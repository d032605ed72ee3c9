// Private: what a checkpoint directory holds, read from its listing and its index (the format is
// described in grouplin/sharded_checkpoint.hpp).
//
//   grouplin::detail::CheckpointDir d = grouplin::detail::read_checkpoint_dir("Qwen3-30B-A3B");
//   for (const std::string& shard : d.shards) open(d.file(shard));   // shards, links followed
//   for (const std::string& f : d.other_files) copy(d.file(f));      // config.json, tokenizer...
//   check_shard_contents(d, tensors_of_each_shard);                  // the index against them
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "grouplin/error.hpp"
#include "grouplin/sharded_checkpoint.hpp"

namespace grouplin::detail {

// Why `name` is no safe path inside a directory ("is absolute", "has a \"..\" component", ...);
// nullptr when it is one: non-empty, relative, each '/'-separated component neither empty, "."
// nor "..", no NUL byte.
const char* unsafe_relative_path(std::string_view name);

// Whether a file of this name (its last component) holds checkpoint weights or an index of
// them: *.safetensors, *.pt, *.pth, pytorch_model*.bin, *.safetensors.index.json,
// *.bin.index.json. Such files are never copied as "other files" of a directory.
bool is_weight_file_name(std::string_view name);

struct CheckpointDir {
  // The directory: as given, or a Hugging Face cache folder's snapshot (path/snapshot).
  std::string path;
  // For a Hugging Face cache folder (models--org--name, holding refs/main and snapshots/):
  // "snapshots/<revision>", the snapshot refs/main names, which `path` then is; else "".
  std::string snapshot;
  std::string index_file;  // its index, relative to path; "" when there is none
  ShardIndex index;        // empty when there is no index
  // Shard files relative to path, sorted; each exists and is a regular file (links followed).
  std::vector<std::string> shards;
  // Every other regular file (links followed), in subfolders too, relative to path, sorted:
  // what a conversion copies unchanged.
  std::vector<std::string> other_files;
  // Weight files that are not shards of this checkpoint (the .bin copy beside safetensors
  // shards, a consolidated.pth), and entries that are neither files nor folders: not read, not
  // copied.
  std::vector<std::string> skipped;
  std::string model_type;  // config.json's "model_type" when it is JSON with that string, else ""

  // path / relative.
  std::string file(const std::string& relative) const;
};

// Lists the directory at `path` and reads its index. Throws Error(IoError) when `path` cannot be
// listed, Error(InvalidIndex), Error(DuplicateName), Error(UnsafePath) for the index,
// Error(ShardMissing) for a shard it names that is missing or not a regular file, and
// Error(UnknownFormat) for a directory with neither an index nor a *.safetensors file. Messages
// name the directory. A Hugging Face cache folder is read as the snapshot its refs/main names
// (Error(UnsafePath) for a revision that is not one path component, Error(IoError) when that
// snapshot is not there).
CheckpointDir read_checkpoint_dir(const std::string& path);

// One shard's tensors, as its reader found them: names and byte sizes, in file order.
using ShardTensors = std::vector<std::pair<std::string, uint64_t>>;

// Checks the shards' contents (`contents[k]` for dir.shards[k]) against each other and the index:
// Error(DuplicateName) for a tensor in two shards; with an index, Error(TensorNotInIndex) for a
// tensor the index does not name, Error(TensorNotInShard) for a tensor the index puts in a shard
// that does not hold it. Messages name the directory, the tensor and the shards. Returns the
// warnings: a total_size that is not the sum of the tensors' bytes (TotalSizeMismatch, keyed by
// the index file), which transformers ignores and so does every reader here.
std::vector<Problem> check_shard_contents(const CheckpointDir& dir,
                                          const std::vector<ShardTensors>& contents);

}  // namespace grouplin::detail
