// Streaming checkpoint conversion: every grouped module to one layout, any format to any format,
// in bounded memory and at the speed of a file copy.
//
//   grouplin::ConvertOptions o;
//   o.layout = grouplin::ExpertLayout::Single;
//   o.progress = [](uint64_t done, uint64_t total) { std::cerr << done << "/" << total << "\r"; };
//   grouplin::ConvertReport r = grouplin::convert_checkpoint("in.pt", "out.safetensors", o);
//
// How it streams: the input is validated by its format's reader over a read-only mapping (only
// headers are read), the output plan (grouped modules per checkpoint_layout.hpp, every other
// entry unchanged) is checked in full, then OUT is written once, front to back, through an
// AtomicFile: a safetensors OUT is its header (built and validated as write_safetensors does)
// followed by the tensor bytes, each expert going straight to its place in a stacked tensor; a
// .pt OUT goes through the zip writer of save_pt. The bytes of IN are read once, with pread, by
// a second thread into four 256 KiB buffers (computing the CRC-32 each zip record needs) while
// the calling thread writes them: faster than one thread, and than copy_file_range (numbers in
// src/io/tensor_stream.hpp). Peak anonymous memory is about 1 MiB plus the headers, whatever the
// file size (tensors the .pt reader had to copy, the rare non-contiguous or misaligned ones,
// excepted). Nothing is left at OUT on failure.
//
// convert_checkpoint shares no state: calls on different outputs may run at once. Each call uses
// one helper thread of its own (the reader) besides the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "grouplin/checkpoint.hpp"
#include "grouplin/checkpoint_layout.hpp"

namespace grouplin {

struct ConvertOptions {
  // Layout of every grouped module in OUT.
  ExpertLayout layout = ExpertLayout::Single;
  // How grouped modules are named (layout_rules.hpp); empty: detected from IN's keys (and
  // model_type). Given sets must each match something (RuleMatchedNothing).
  std::vector<LayoutRules> rules{};
  std::string model_type{};  // config.json's model_type, to tell fused Hugging Face families apart
  // Keep only experts [begin, end) of every grouped module, renumbered from 0 (one rank of an
  // expert-parallel job): only their bytes are read. Unset: all experts.
  std::optional<ExpertRange> experts{};
  // Format of OUT; when not set, the one OUT's extension names (format_for_extension).
  std::optional<CheckpointFormat> format;
  // Replace an existing OUT (never IN).
  bool overwrite = false;
  // Called on the calling thread at the start, after every 16 MiB of tensor data written and at
  // the end, with the bytes of tensor data written so far and in all. May be empty; may throw
  // to abandon the conversion (OUT is then left as it was): Error(Interrupted) when a user asked
  // to stop (the CLI does so on SIGINT and SIGTERM).
  std::function<void(uint64_t done, uint64_t total)> progress;
};

struct ConvertReport {
  CheckpointFormat input_format = CheckpointFormat::Safetensors;
  CheckpointFormat output_format = CheckpointFormat::Safetensors;
  std::vector<GroupedModule> modules;  // grouped modules of IN, in their IN layout
  size_t input_tensors = 0;
  size_t output_tensors = 0;
  uint64_t data_bytes = 0;  // tensor bytes written
  uint64_t file_bytes = 0;  // size of OUT
};

// Converts the checkpoint at `in` into `out` (see above). Safetensors metadata is kept when both
// files are safetensors (a .pt file has none to give or keep).
// Throws, before OUT is created: Error(InvalidArgument) when OUT is IN (same file, by device and
// inode) or exists without options.overwrite; Error(UnknownFormat) when no format is given and
// OUT's extension names none; the input's errors (IoError, UnknownFormat, the readers' codes);
// the scan's errors (PartialExpertSet, BothLayoutsPresent, ShapeMismatch, DTypeMismatch), all
// naming IN; for a .pt OUT, what load_pt would refuse (Error(PickleLimitExceeded): a name over
// 65536 bytes, more than 64 dimensions), naming OUT and the tensor, before any byte is written.
// While writing: Error(IoError), Error(Truncated) if IN shrinks meanwhile (tensor
// bytes are read with pread, never through the mapping, so this is an error and not a SIGBUS;
// the message names IN, the tensor, its byte range and where IN now ends), whatever
// options.progress throws; OUT is then left as it was (absent, or the old file), and no
// temporary file remains.
ConvertReport convert_checkpoint(const std::string& in, const std::string& out,
                                 const ConvertOptions& options = {});

}  // namespace grouplin
