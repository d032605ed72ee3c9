// Sharded checkpoints: a directory of shard files and an index, as Hugging Face saves (and people
// download) large models. load_checkpoint, inspect_checkpoint, compare_checkpoints and
// convert_checkpoint take such a directory wherever they take a file; this header holds the
// pieces of the format itself.
//
//   grouplin::ShardIndex index = grouplin::parse_shard_index(
//       R"({"metadata": {"total_size": 96}, "weight_map": {"w": "model.safetensors"}})", "index");
//   const std::vector<uint64_t> sizes = {64, 32, 16};  // bytes of each tensor, in order
//   std::vector<std::vector<size_t>> shards =
//       grouplin::plan_shards(sizes, grouplin::parse_byte_size("80B"));  // {{0}, {1, 2}}
//   std::string name = grouplin::shard_file_name(grouplin::CheckpointFormat::Safetensors, 0, 2);
//   // "model-00001-of-00002.safetensors"
//
// A checkpoint directory holds, in the order looked for:
//   model.safetensors.index.json   {"metadata": {"total_size": B, ...}, "weight_map": {key: shard}}
//   pytorch_model.bin.index.json   the same for .bin shards (PyTorch zip files)
//   neither: every *.safetensors file directly in the directory is a shard.
// A directory reads as one state dict whose tensors are in natural key order (runs of digits
// compared as numbers: model.layers.2 before model.layers.10), whatever shard holds each, so that
// what is written from it depends on the names alone. Shards are followed through symbolic links
// (the Hugging Face cache links snapshots/<rev>/ into ../../blobs/). Every other file
// (config.json, tokenizer files, ...) is not a weight and is copied unchanged by
// convert_checkpoint; config.json's "model_type" names the model family when layout rules need it
// (layout_rules.hpp). What a directory can get wrong, each a named error naming the directory and
// the file, shard or tensor:
//
//   the index is not JSON, not an object, has no "weight_map" object of    InvalidIndex
//     strings, or "metadata" is not an object or its "total_size" not an
//     integer >= 0
//   a key twice in the index's JSON, or a tensor in two shards              DuplicateName
//   a shard name that is empty, absolute, or has a "." or ".." component    UnsafePath
//   the index names a shard that does not exist                             ShardMissing
//   the index names a tensor that its shard does not hold                   TensorNotInShard
//   a shard holds a tensor the index does not name                          TensorNotInIndex
//   no index and no *.safetensors file, or shards of both formats           UnknownFormat
//
// plus each shard's own reader errors (safetensors.hpp, pt_file.hpp), naming the shard. A
// "total_size" that is not the sum of the tensors' bytes is only a warning (TotalSizeMismatch in
// Checkpoint::warnings, CheckpointSummary::warnings, ConvertReport::warnings and
// CompareReport::warnings): transformers never reads the field, and every reader goes on.
//
// The functions below share no state; they may run on several threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "grouplin/checkpoint.hpp"

namespace grouplin {

// Hugging Face's default largest shard of save_pretrained (transformers 4): 5 GB.
inline constexpr uint64_t kDefaultMaxShardSize = 5'000'000'000;
// Largest index file read: the safetensors header cap (about 100 bytes per tensor name and shard).
inline constexpr uint64_t kMaxShardIndexSize = 100'000'000;

// A parsed index file.
struct ShardIndex {
  // metadata.total_size: the bytes of every tensor of the checkpoint (not of the files).
  std::optional<uint64_t> total_size;
  // metadata.total_parameters (transformers 5 writes it): the elements of every tensor.
  std::optional<uint64_t> total_parameters;
  // key -> shard file name (relative to the directory), sorted by key.
  std::vector<std::pair<std::string, std::string>> weight_map;
};

// Parses and checks an index file's text (see above: InvalidIndex, DuplicateName, UnsafePath).
// Other metadata fields are allowed and ignored. `context` starts each message
// ("reading \"dir/model.safetensors.index.json\"").
ShardIndex parse_shard_index(std::string_view json, const std::string& context);

// The text of an index file as transformers writes it: json.dumps(index, indent=2,
// sort_keys=True) + "\n", with "total_size" (and "total_parameters" when set) in "metadata".
std::string shard_index_json(const ShardIndex& index);

// Groups tensors of `sizes` bytes, in order, into shards of at most `max_shard_size` bytes as
// Hugging Face does: a tensor joins the current shard unless that would pass the limit, which
// starts a new shard; a tensor larger than the limit alone gets a shard of its own, placed
// before the shard being filled. Returns the tensors' indices per shard; no empty shard.
std::vector<std::vector<size_t>> plan_shards(std::span<const uint64_t> sizes,
                                             uint64_t max_shard_size);

// "model-00002-of-00005.safetensors" / "pytorch_model-00002-of-00005.bin" for shard `index`
// (from 0) of `count`; "model.safetensors" / "pytorch_model.bin" when count is 1.
std::string shard_file_name(CheckpointFormat format, size_t index, size_t count);
// "model.safetensors.index.json" / "pytorch_model.bin.index.json".
std::string shard_index_file_name(CheckpointFormat format);

// Parses a size as Hugging Face writes it: an integer of bytes, or a number followed by a unit,
// B, KB, MB, GB, TB (powers of 1000; the prefix in either case, the B upper-case: "5GB", "40kB")
// or KiB, MiB, GiB, TiB (powers of 1024, in any case: "1.5GiB", "2gib"). Throws
// Error(InvalidArgument) naming the text for anything else, for zero and for sizes past 2^64; a
// decimal unit with a lower-case b ("5gb", "5Gb") is refused as ambiguous, since transformers
// reads it as bits.
uint64_t parse_byte_size(std::string_view text);

}  // namespace grouplin
