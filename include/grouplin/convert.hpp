// Streaming checkpoint conversion: every grouped module to one layout, any format to any format,
// a file or a sharded directory to a file or a sharded directory, in bounded memory and at the
// speed of a file copy.
//
//   grouplin::ConvertOptions o;
//   o.layout = grouplin::ExpertLayout::Single;
//   o.progress = [](uint64_t done, uint64_t total) { std::cerr << done << "/" << total << "\r"; };
//   grouplin::ConvertReport r = grouplin::convert_checkpoint("in.pt", "out.safetensors", o);
//   o.max_shard_size = grouplin::parse_byte_size("5GB");       // a directory of shards
//   r = grouplin::convert_checkpoint("Qwen3-30B-A3B", "Qwen3-30B-A3B-fused", o);
//
// How it streams: the input (one file, or every shard of a directory, sharded_checkpoint.hpp) is
// validated by its format's reader over read-only mappings (only headers are read), the output
// plan (grouped modules per checkpoint_layout.hpp, every other entry unchanged) is checked in
// full, then each output file is written once, front to back, through an AtomicFile: a
// safetensors file is its header (built and validated as write_safetensors does) followed by the
// tensor bytes, each expert going straight to its place in a stacked tensor, whichever input
// shard holds it; a .pt file goes through the zip writer of save_pt. The bytes of the input are
// read once, with pread, by a second thread into four 256 KiB buffers (computing the CRC-32 each
// zip record needs) while the calling thread writes them: faster than one thread, and than
// copy_file_range (numbers in src/io/operations/tensor_stream.hpp). Peak anonymous memory is about
// 1 MiB plus the headers, whatever the checkpoint's size (tensors the .pt reader had to copy, the
// rare non-contiguous or misaligned ones, excepted). Nothing is left at OUT on failure.
//
// A directory OUT is built in a hidden temporary directory beside OUT and renamed into place
// (exchanged with the old OUT under `overwrite`, which is then removed; see ConvertOptions::
// overwrite for what an old OUT may hold): shards in Hugging Face's
// naming (shard_file_name) of at most max_shard_size tensor bytes each (plan_shards), the index
// (shard_index_json: exact total_size and weight_map; total_parameters when the input's index had
// it) when there are several, and every other file of an input directory copied unchanged
// (config.json, tokenizer files, ...); weight files that are not the input's shards are neither
// read nor copied (ConvertReport::skipped_files).
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
#include "grouplin/error.hpp"
#include "grouplin/sharded_checkpoint.hpp"

namespace grouplin {

struct ConvertOptions {
  // Layout of every grouped module in OUT; nullopt keeps the layout IN has (a change of format,
  // sharding, dtype or experts only): Error(InvalidArgument) when IN has modules in both.
  std::optional<ExpertLayout> layout = ExpertLayout::Single;
  // How grouped modules are named (layout_rules.hpp); empty: detected from IN's keys (and
  // model_type). Given sets must each match something (RuleMatchedNothing).
  std::vector<LayoutRules> rules{};
  // config.json's model_type, to tell fused Hugging Face families apart; empty: an input
  // directory's own config.json says.
  std::string model_type{};
  // Keep only experts [begin, end) of every grouped module, renumbered from 0 (one rank of an
  // expert-parallel job): only their bytes are read. Unset: all experts.
  std::optional<ExpertRange> experts{};
  // When set (F32, BF16 or F16): every FP8 weight (F8_E4M3, F8_E5M2) with its scales beside it
  // (W and W_scale_inv: experts and dense layers alike) is written as its values in this dtype
  // and its scales are dropped: each code decoded to F32 times its block's scale in F32, rounded
  // once (PyTorch's `(q.float() * scale).to(dtype)`, bit for bit), streaming. Every other entry
  // is unchanged. An FP8 weight without scales is Error(Fp8ScalesNotApplied).
  std::optional<DType> dtype{};
  // Format of OUT; when not set, the input's for a directory OUT, else the one OUT's extension
  // names (format_for_extension).
  std::optional<CheckpointFormat> format;
  // When set, OUT is a directory of shards of at most this many tensor bytes (a shard is larger
  // only when one tensor alone is). When not set, OUT is a directory of shards of at most
  // kDefaultMaxShardSize if IN is a directory and OUT's name has no checkpoint extension
  // (.safetensors, .pt, .pth, .bin), else one file.
  std::optional<uint64_t> max_shard_size;
  // Of a .pt training checkpoint, the dict of tensors to read (PtReadOptions::state_dict_key);
  // empty: the top level, or its only dict of tensors.
  std::string state_dict_key{};
  // Replace an existing OUT (never IN, nor a folder holding one of IN's files). A directory OUT
  // is replaced only when it holds nothing but what a conversion writes there: weight and index
  // files directly in it (*.safetensors, *.pt, *.pth, pytorch_model*.bin, *.safetensors.index.json,
  // *.bin.index.json: a previous output's shards, which go) and the files copied from an input
  // directory, in their folders (config.json, tokenizer files, ...). Anything else (notes, a
  // subfolder of one's own) is Error(OutputHoldsOtherFiles), and nothing is written or deleted.
  bool overwrite = false;
  // Called on the calling thread at the start, after every 16 MiB of tensor data written and at
  // the end, with the bytes of tensor data written so far and in all. May be empty; may throw
  // to abandon the conversion (OUT is then left as it was): Error(Interrupted) when a user asked
  // to stop (the CLI does so on SIGINT and SIGTERM).
  std::function<void(uint64_t done, uint64_t total)> progress;
};

// Where the rules of a conversion came from.
enum class RulesFrom {
  Given,      // ConvertOptions::rules (--rules)
  ModelType,  // the family config.json's model_type (or ConvertOptions::model_type) names
  Names,      // detected from the tensor names (detect_rules)
};

struct ConvertReport {
  CheckpointFormat input_format = CheckpointFormat::Safetensors;
  CheckpointFormat output_format = CheckpointFormat::Safetensors;
  std::vector<GroupedModule> modules;          // grouped modules of IN, in their IN layout
  ExpertLayout layout = ExpertLayout::Single;  // of OUT's modules (ConvertOptions::layout, or kept)
  // The rule sets that found them (GroupedModule::rules, each once, in module order), and whence.
  std::vector<std::string> rules;
  RulesFrom rules_from = RulesFrom::Names;
  size_t input_tensors = 0;
  size_t output_tensors = 0;
  uint64_t data_bytes = 0;        // tensor bytes written
  size_t dequantized = 0;         // FP8 weights written as values (ConvertOptions::dtype)
  uint64_t file_bytes = 0;        // bytes of the checkpoint files written (shards and index)
  bool directory_output = false;  // OUT is a directory
  // The checkpoint files written: OUT's file name, or the shards and the index in OUT.
  std::vector<std::string> output_files;
  // Other files of an input directory copied into OUT, and their bytes; weight files and
  // entries that are not files, neither read nor copied (relative to IN).
  std::vector<std::string> copied_files;
  uint64_t copied_bytes = 0;
  std::vector<std::string> skipped_files;
  // Of an input directory converted to one file: its other files (config.json, tokenizer files),
  // which a file output cannot hold and which were not copied (relative to IN).
  std::vector<std::string> left_files;
  // Other files written changed, one line each ("config.json: quantization_config removed ..."):
  // with ConvertOptions::dtype, a config.json that declares FP8 weights no longer does.
  std::vector<std::string> edited_files;
  // What IN gets wrong without stopping the conversion, as Checkpoint::warnings (an input index's
  // total_size that is not its tensors' bytes; OUT's index is exact all the same).
  std::vector<Problem> warnings;
};

// Converts the checkpoint at `in` (a file or a directory) into `out` (see above). Safetensors
// metadata is kept when both are safetensors (a .pt file has none to give or keep; the metadata of
// a directory is what all its shards agree on).
// Throws, before OUT is created: Error(InvalidArgument) when OUT is IN or one of its files (by
// device and inode), is inside an input directory, holds one of IN's files, exists without
// options.overwrite, or max_shard_size is 0; Error(OutputHoldsOtherFiles) naming the first five
// entries (relative to OUT) and how many more when a directory OUT to be replaced holds more than
// a conversion writes (checked again just before the replacement: OUT is then left as it was);
// the directory errors of sharded_checkpoint.hpp;
// Error(UnknownFormat) when no format is given and OUT's extension names none; the input's errors
// (IoError, UnknownFormat, the readers' codes); the scan's errors (PartialExpertSet,
// BothLayoutsPresent, ShapeMismatch, DTypeMismatch), all naming IN; for a .pt OUT, what load_pt
// would refuse (Error(PickleLimitExceeded): a name over 65536 bytes, more than 64 dimensions),
// naming OUT and the tensor, before any byte is written. While writing: Error(IoError),
// Error(Truncated) if IN shrinks meanwhile (tensor bytes are read with pread, never through the
// mapping, so this is an error and not a SIGBUS; the message names IN, the tensor, its byte range
// and where IN now ends), whatever options.progress throws; OUT is then left as it was (absent, or
// the old file), and no temporary file remains.
ConvertReport convert_checkpoint(const std::string& in, const std::string& out,
                                 const ConvertOptions& options = {});

// The report as the JSON document of `grouplin convert --json` (Python's grouplin.convert returns
// it as a dict): IN and OUT as given, the fields above (modules in brief: prefix, layout,
// num_experts, rules; warnings as {code, key, message}); schema in docs/cli.md, fields only ever
// added. Pure ASCII, indented by 2, no final newline.
std::string convert_report_json(const ConvertReport& report, const std::string& in,
                                const std::string& out);

}  // namespace grouplin
