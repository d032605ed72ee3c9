// Checkpoint files of either format, chosen by content when reading and by request or file
// extension when writing; a checkpoint read may also be a directory of shards
// (sharded_checkpoint.hpp).
//
//   grouplin::Checkpoint c = grouplin::load_checkpoint("model.pt");   // or .safetensors
//   grouplin::Checkpoint m = grouplin::load_checkpoint("Mixtral-8x7B");  // every shard, mapped
//   if (c.format == grouplin::CheckpointFormat::Pt) std::cout << c.tensors.size() << " tensors\n";
//   grouplin::save_checkpoint("model.safetensors", c.tensors);        // format from the extension
//   grouplin::save_checkpoint("out.bin", c.tensors, grouplin::CheckpointFormat::Pt);
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "grouplin/error.hpp"
#include "grouplin/file.hpp"
#include "grouplin/state_dict.hpp"

namespace grouplin {

enum class CheckpointFormat { Safetensors, Pt };

// "safetensors" or "pt".
std::string_view format_name(CheckpointFormat format);

// The format of the file at `path`, from its first bytes: a zip local header ("PK\3\4") is a
// PyTorch file; a little-endian u64 header length N with 2 <= N <= 100,000,000, 8 + N within the
// file and '{' as the first header byte is safetensors. Nothing else is read or validated (the
// loaders do that). Throws Error(IoError) if the file cannot be read, Error(Truncated) for a
// safetensors header that ends past the end of the file, Error(UnknownFormat) naming the file
// and what it is when its first bytes tell (a legacy torch.save, GGUF, .npy, HDF5, gzip, a Git
// LFS pointer), else its first bytes.
CheckpointFormat detect_format(const std::string& path);

// The format an extension names: ".safetensors" -> Safetensors; ".pt", ".pth", ".bin" (as
// Hugging Face's pytorch_model.bin) -> Pt; compared case-insensitively. nullopt for any other.
std::optional<CheckpointFormat> format_for_extension(const std::string& path);

// A loaded checkpoint. `metadata` is the safetensors "__metadata__" map (of a directory: the
// entries all its shards agree on); always empty for .pt files, which have no such thing.
struct Checkpoint {
  StateDict tensors;
  std::map<std::string, std::string> metadata;
  CheckpointFormat format = CheckpointFormat::Safetensors;
  // For a directory: config.json's model_type ("" when it names none; detect_rules and
  // LoadOptions take it) and the shard files read, relative to the directory.
  std::string model_type;
  std::vector<std::string> shards;
  // For a directory: what it gets wrong without stopping the load, each with its code and the
  // file it concerns: an index's total_size that is not its tensors' bytes (TotalSizeMismatch;
  // transformers ignores the field too). Empty for a file.
  std::vector<Problem> warnings;
};

// Loads a file (format detected by content, the extension ignored) with load_safetensors or
// load_pt, or a directory of shards as one state dict, checked against its index
// (sharded_checkpoint.hpp; its tensors in natural key order: layers.2 before layers.10). Tensors
// are zero-copy read-only views of the mappings, which they keep alive (misaligned ones excepted:
// copied). With `mode` CopyOnWrite the views are writable and a write never reaches the file
// (MapMode: for callers that hand the tensors to code that may write, as Python's torch does).
// Throws what detect_format and the loaders throw (messages name the file), and for a
// directory the errors listed in sharded_checkpoint.hpp.
Checkpoint load_checkpoint(const std::string& path, MapMode mode = MapMode::ReadOnly);

// Writes `tensors` atomically (temporary file, fsync, rename) with save_safetensors or save_pt.
// The format is `format` if given, else the one `path`'s extension names, else safetensors (the
// default format). `metadata` goes into the safetensors "__metadata__"; a .pt file has no place
// for it and it is dropped. Throws what that saver throws; on error an existing file at `path`
// is left untouched.
void save_checkpoint(const std::string& path, const StateDict& tensors,
                     std::optional<CheckpointFormat> format = {},
                     const std::map<std::string, std::string>& metadata = {});

}  // namespace grouplin
