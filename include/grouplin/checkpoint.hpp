// Checkpoint files of either format, chosen by content when reading and by request or file
// extension when writing.
//
//   grouplin::Checkpoint c = grouplin::load_checkpoint("model.pt");   // or .safetensors
//   if (c.format == grouplin::CheckpointFormat::Pt) std::cout << c.tensors.size() << " tensors\n";
//   grouplin::save_checkpoint("model.safetensors", c.tensors);        // format from the extension
//   grouplin::save_checkpoint("out.bin", c.tensors, grouplin::CheckpointFormat::Pt);
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "grouplin/state_dict.hpp"

namespace grouplin {

enum class CheckpointFormat { Safetensors, Pt };

// "safetensors" or "pt".
std::string_view format_name(CheckpointFormat format);

// The format of the file at `path`, from its first bytes: a zip local header ("PK\3\4") is a
// PyTorch file; a little-endian u64 header length N with 2 <= N <= 100,000,000, 8 + N within the
// file and '{' as the first header byte is safetensors. Nothing else is read or validated (the
// loaders do that). Throws Error(IoError) if the file cannot be read, Error(UnknownFormat)
// naming the file and its first bytes otherwise.
CheckpointFormat detect_format(const std::string& path);

// The format an extension names: ".safetensors" -> Safetensors; ".pt", ".pth", ".bin" (as
// Hugging Face's pytorch_model.bin) -> Pt; compared case-insensitively. nullopt for any other.
std::optional<CheckpointFormat> format_for_extension(const std::string& path);

// A loaded checkpoint. `metadata` is the safetensors "__metadata__" map; always empty for .pt
// files, which have no such thing.
struct Checkpoint {
  StateDict tensors;
  std::map<std::string, std::string> metadata;
  CheckpointFormat format = CheckpointFormat::Safetensors;
};

// Detects the format by content (the extension is ignored) and loads the file with
// load_safetensors or load_pt: tensors are zero-copy views of the mapping, which they keep alive.
// Throws what detect_format and that loader throw (messages name the file).
Checkpoint load_checkpoint(const std::string& path);

// Writes `tensors` atomically (temporary file, fsync, rename) with save_safetensors or save_pt.
// The format is `format` if given, else the one `path`'s extension names, else safetensors (the
// default format). `metadata` goes into the safetensors "__metadata__"; a .pt file has no place
// for it and it is dropped. Throws what that saver throws; on error an existing file at `path`
// is left untouched.
void save_checkpoint(const std::string& path, const StateDict& tensors,
                     std::optional<CheckpointFormat> format = {},
                     const std::map<std::string, std::string>& metadata = {});

}  // namespace grouplin
