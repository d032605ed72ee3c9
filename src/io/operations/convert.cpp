// Streaming checkpoint conversion (see grouplin/convert.hpp): plan everything, then write OUT
// (a file, or a directory of shards) front to back from byte ranges of IN's files.
#include "grouplin/convert.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "core/fp8.hpp"
#include "grouplin/error.hpp"
#include "grouplin/file.hpp"
#include "grouplin/safetensors.hpp"
#include "grouplin/sharded_checkpoint.hpp"
#include "io/checkpoints/atomic_directory.hpp"
#include "io/checkpoints/checkpoint_dir.hpp"
#include "io/checkpoints/checkpoint_source.hpp"
#include "io/checkpoints/commit_calls.hpp"
#include "io/checkpoints/free_space.hpp"
#include "io/formats/pt_writer.hpp"
#include "io/formats/safetensors_header.hpp"
#include "io/formats/zip.hpp"
#include "io/operations/tensor_stream.hpp"
#include "layout/dequantize_plan.hpp"
#include "layout/plan.hpp"

namespace grouplin {
namespace {

// Calls the user's progress callback with a running total, at most every kProgressStep bytes
// (and at the start and the end).
class Progress {
 public:
  static constexpr uint64_t kProgressStep = uint64_t{16} << 20;

  Progress(const ConvertOptions& options, uint64_t total) : fn_(options.progress), total_(total) {
    report();
  }
  void advance(uint64_t n) {
    done_ += n;
    if (done_ - reported_ >= kProgressStep || done_ == total_) report();
  }

 private:
  void report() {
    reported_ = done_;
    if (fn_) fn_(done_, total_);
  }
  const std::function<void(uint64_t, uint64_t)>& fn_;
  uint64_t total_;
  uint64_t done_ = 0;
  uint64_t reported_ = 0;
};

void write_safetensors_out(FileSink& sink, const detail::CheckpointSource& src,
                           std::span<const PlannedTensor> tensors,
                           const std::map<std::string, std::string>& metadata,
                           const std::string& context, Progress& progress) {
  std::vector<SafetensorsEntry> entries;
  entries.reserve(tensors.size());
  for (const PlannedTensor& t : tensors) entries.push_back({t.name, t.dtype, t.shape, 0, 0});
  const SafetensorsWritePlan layout = plan_safetensors_write(std::move(entries), metadata, context);

  std::byte length[8];
  for (int i = 0; i < 8; ++i) {
    length[i] = static_cast<std::byte>((layout.header.size() >> (8 * i)) & 0xFF);
  }
  sink.write(length);
  sink.write(std::as_bytes(std::span(layout.header.data(), layout.header.size())));
  // The data buffer follows the header: every tensor's output offset is known.
  const uint64_t data_start = sink.position();
  std::vector<uint64_t> offsets;
  offsets.reserve(layout.entries.size());
  for (const SafetensorsEntry& e : layout.entries) offsets.push_back(data_start + e.begin);
  detail::TensorStream stream(src, tensors, layout.order, std::move(offsets), /*crc=*/false);
  stream.drain(layout.data_size, [&](std::span<const std::byte> bytes) {
    sink.write(bytes);
    progress.advance(bytes.size());
  });
}

void write_pt_out(FileSink& sink, const detail::CheckpointSource& src,
                  std::span<const PlannedTensor> tensors_out, const std::string& context,
                  Progress& progress) {
  // One record per tensor, numbered in dict order, as save_pt writes tensors that share nothing.
  std::vector<detail::PtTensorSpec> tensors;
  std::vector<detail::PtRecordSpec> records;
  std::vector<size_t> order;
  tensors.reserve(tensors_out.size());
  records.reserve(tensors_out.size());
  for (size_t k = 0; k < tensors_out.size(); ++k) {
    const PlannedTensor& t = tensors_out[k];
    tensors.push_back({t.name, t.dtype, t.shape, k, 0});
    records.push_back({std::to_string(k), t.nbytes()});
    order.push_back(k);
  }
  // The reader thread computes each record's CRC-32 (the zip format needs it) as it reads, and
  // cuts its chunks on the output's grid, as every record's place is known before writing.
  const detail::PtArchive archive(tensors, records, sink.position(), context);
  std::vector<uint64_t> offsets;
  offsets.reserve(records.size());
  for (size_t k = 0; k < records.size(); ++k) offsets.push_back(archive.record_data_offset(k));
  detail::TensorStream stream(src, tensors_out, std::move(order), std::move(offsets),
                              /*crc=*/true);
  archive.write(sink, [&](size_t k, zip::ZipWriter& zip) -> std::optional<uint32_t> {
    stream.drain(records[k].nbytes, [&](std::span<const std::byte> bytes) {
      zip.write_without_crc(bytes);
      progress.advance(bytes.size());
    });
    return stream.crc(k);
  });
}

// Writes `tensors` as one file of `format` at `path` (atomically, committed with `calls`);
// returns its size.
uint64_t write_file(const std::string& path, const detail::CheckpointSource& src,
                    std::span<const PlannedTensor> tensors, CheckpointFormat format,
                    const std::map<std::string, std::string>& metadata, Progress& progress,
                    detail::CommitCalls& calls = detail::CommitCalls::system()) {
  std::unique_ptr<AtomicFile> file = detail::create_atomic_file(path, calls);
  if (format == CheckpointFormat::Safetensors) {
    write_safetensors_out(*file, src, tensors, metadata, "saving " + quote(path), progress);
  } else {
    write_pt_out(*file, src, tensors, "saving " + quote(path), progress);
  }
  const uint64_t size = file->position();
  // A failure to flush the folder after the rename is not reported (folder_flush_error()): the
  // file is whole and in place, and the OS writes the folder entry back on its own.
  file->commit();
  return size;
}

// Copies the file at `from` (its bytes only, links followed) to a new file at `to`. Throws
// IoError.
uint64_t copy_plain_file(const std::string& from, const std::string& to) {
  std::error_code ec;
  std::filesystem::copy_file(from, to, ec);
  const uint64_t size = ec ? 0 : std::filesystem::file_size(to, ec);
  if (ec) {
    throw Error(ErrorCode::IoError,
                "copying " + quote(from) + " to " + quote(to) + ": " + ec.message());
  }
  return size;
}

// config.json without its FP8 quantization_config, once the weights are written as values: else
// transformers would take the values for FP8 codes and look for the dropped scales. Writes it as
// transformers does (sorted keys, indent 2) and returns true; false when it declares no FP8
// weights (or is not a JSON object), for a plain copy.
bool write_dequantized_config(const std::string& from, const std::string& to,
                              ConvertReport& report) {
  std::ifstream in(from, std::ios::binary);
  const nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object() || !config.contains("quantization_config")) return false;
  const nlohmann::json& q = config["quantization_config"];
  if (!q.is_object() || q.value("quant_method", "") != "fp8") return false;
  nlohmann::json out = config;
  out.erase("quantization_config");
  const std::string text = out.dump(2) + "\n";
  std::ofstream f(to, std::ios::binary);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  f.close();
  if (!f) throw Error(ErrorCode::IoError, "writing " + quote(to));
  report.copied_bytes += text.size();
  report.copied_files.push_back("config.json");
  report.edited_files.push_back(
      "config.json: quantization_config (fp8) removed: the weights are written as values");
  return true;
}

// Entries of the directory `out` that a conversion neither writes nor copies, relative to it and
// sorted ("notes/", "thesis.tex"): everything but weight and index files directly in `out`
// (is_weight_file_name: a previous output's shards) and the files copied from the input
// (`copied`) with the folders that lead to them. A folder that leads to none of those is one
// entry, not entered: a home directory named as OUT costs one listing, not a walk of all of it.
// Links are not followed (replacing one removes the link, not what it points to). Throws
// Error(IoError) when a folder cannot be listed.
std::vector<std::string> entries_not_replaced(const std::string& out,
                                              const std::vector<std::string>& copied,
                                              const std::string& context) {
  namespace fs = std::filesystem;
  std::set<std::string> files(copied.begin(), copied.end());
  std::set<std::string> folders;
  for (const std::string& f : copied) {
    for (size_t slash = f.find('/'); slash != std::string::npos; slash = f.find('/', slash + 1)) {
      folders.insert(f.substr(0, slash));
    }
  }
  std::vector<std::string> other;
  std::vector<std::string> pending = {""};  // folders to list, relative to `out`
  while (!pending.empty()) {
    const std::string rel = std::move(pending.back());
    pending.pop_back();
    std::error_code ec;
    for (fs::directory_iterator it(fs::path(out) / rel, ec), end; !ec && it != end;
         it.increment(ec)) {
      const std::string name = it->path().filename().string();
      const std::string path = rel.empty() ? name : rel + "/" + name;
      const bool folder = it->symlink_status(ec).type() == fs::file_type::directory;
      if (ec) break;
      if (folder) {
        if (folders.count(path)) {
          pending.push_back(path);
        } else {
          other.push_back(path + "/");
        }
      } else if (!(rel.empty() && detail::is_weight_file_name(name)) && !files.count(path)) {
        other.push_back(path);
      }
    }
    if (ec) {
      throw Error(
          ErrorCode::IoError,
          context + ": listing " + quote((fs::path(out) / rel).string()) + ": " + ec.message());
    }
  }
  std::sort(other.begin(), other.end());
  return other;
}

// Refuses to replace the directory `out` while it holds anything a conversion of `src` would not
// write again: --force must never cost data that the conversion does not replace.
void check_replaceable_directory(const std::string& in, const std::string& out,
                                 const detail::CheckpointSource& src) {
  const std::string context = "converting " + quote(in) + ": the output " + quote(out);
  static const std::vector<std::string> kNone;
  const std::vector<std::string> other =
      entries_not_replaced(out, src.directory() ? src.directory()->other_files : kNone, context);
  if (other.empty()) return;
  constexpr size_t kShown = 5;
  std::string names;
  for (size_t i = 0; i < other.size() && i < kShown; ++i)
    names += (i ? ", " : "") + quote(other[i]);
  if (other.size() > kShown) names += " and " + std::to_string(other.size() - kShown) + " more";
  throw Error(ErrorCode::OutputHoldsOtherFiles,
              context + " holds " + std::to_string(other.size()) + " entr" +
                  (other.size() == 1 ? "y" : "ies") +
                  " that a conversion does not write: " + names +
                  "; --force replaces a directory only when it holds nothing but shards, an "
                  "index and files copied from the input; move them away or choose another "
                  "output");
}

// Writes OUT as a directory: shards of the plan's tensors in Hugging Face's naming, the index
// when there are several, and every other file of an input directory unchanged.
void write_directory(const std::string& in, const std::string& out,
                     const detail::CheckpointSource& src, const ConversionPlan& plan,
                     CheckpointFormat format, const std::map<std::string, std::string>& metadata,
                     uint64_t max_shard_size, bool replace, Progress& progress,
                     ConvertReport& report) {
  std::unique_ptr<detail::AtomicDirectory> dir = detail::AtomicDirectory::create(out);
  std::vector<uint64_t> sizes;
  sizes.reserve(plan.tensors.size());
  for (const PlannedTensor& t : plan.tensors) sizes.push_back(t.nbytes());
  const std::vector<std::vector<size_t>> shards = plan_shards(sizes, max_shard_size);

  ShardIndex index;
  index.total_size = 0;
  uint64_t parameters = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string name = shard_file_name(format, s, shards.size());
    std::vector<PlannedTensor> tensors;
    tensors.reserve(shards[s].size());
    for (size_t k : shards[s]) {
      tensors.push_back(plan.tensors[k]);
      index.weight_map.emplace_back(plan.tensors[k].name, name);
      *index.total_size += plan.tensors[k].nbytes();
      parameters += static_cast<uint64_t>(shape_numel(plan.tensors[k].shape));
    }
    report.file_bytes += write_file(dir->file(name), src, tensors, format, metadata, progress,
                                    dir->deferred_flush());
    report.output_files.push_back(name);
  }
  // One shard is written as a plain model file, without an index, as transformers does.
  if (shards.size() > 1) {
    const detail::CheckpointDir* in_dir = src.directory();
    if (in_dir && in_dir->index.total_parameters) index.total_parameters = parameters;
    std::sort(index.weight_map.begin(), index.weight_map.end());
    const std::string text = shard_index_json(index);
    const std::string name = shard_index_file_name(format);
    std::unique_ptr<AtomicFile> file =
        detail::create_atomic_file(dir->file(name), dir->deferred_flush());
    file->write(std::as_bytes(std::span(text.data(), text.size())));
    file->commit();
    report.file_bytes += text.size();
    report.output_files.push_back(name);
  }
  if (const detail::CheckpointDir* in_dir = src.directory()) {
    for (const std::string& f : in_dir->other_files) {
      if (f == "config.json" && report.dequantized > 0 &&
          write_dequantized_config(in_dir->file(f), dir->file(f), report)) {
        continue;
      }
      report.copied_bytes += copy_plain_file(in_dir->file(f), dir->file(f));
      report.copied_files.push_back(f);
    }
    report.skipped_files = in_dir->skipped;
  }
  // Checked before anything was written (check_output), and again now: a file put into OUT
  // during a long conversion would otherwise go with the exchange.
  if (replace && std::filesystem::is_directory(out)) check_replaceable_directory(in, out, src);
  dir->commit(replace);
}

// `p` made absolute and free of "." and "..", links resolved where it exists, without a
// trailing '/' (whose empty last component would make "dir/" hold nothing).
std::filesystem::path resolved(const std::string& p) {
  std::error_code ec;
  std::filesystem::path r = std::filesystem::weakly_canonical(p, ec);
  if (ec) r = std::filesystem::absolute(p).lexically_normal();
  return detail::without_trailing_separator(r);
}

bool is_within(const std::filesystem::path& inner, const std::filesystem::path& outer) {
  auto [o, i] = std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end());
  return o == outer.end();
}

// Refuses OUT when it is IN (or one of its files), lies inside an input directory, or holds
// one of the input's files (replacing it would delete them), or exists and may not be replaced:
// without `overwrite`, or a directory holding more than a conversion writes.
void check_output(const std::string& in, const std::string& out,
                  const detail::CheckpointSource& src, bool directory_out, bool overwrite) {
  const std::string context = "converting " + quote(in) + ": the output " + quote(out);
  const std::filesystem::path out_path = resolved(out);
  if (src.directory() && is_within(out_path, resolved(in))) {
    throw Error(ErrorCode::InvalidArgument,
                context + " is the input directory or inside it; expected a place outside it");
  }
  for (const detail::CheckpointSource::File& f : src.files()) {
    if (is_within(resolved(f.path), out_path) && resolved(f.path) != out_path) {
      throw Error(ErrorCode::InvalidArgument,
                  context + " holds the input file " + quote(f.path) +
                      "; replacing it would delete the input, refusing");
    }
  }
  struct stat st;
  if (::stat(out.c_str(), &st) != 0) {
    if (errno != ENOENT) throw Error(ErrorCode::IoError, context + ": " + std::strerror(errno));
    // The folder it goes in is named as such, not through the temporary file's name.
    const std::string folder = detail::folder_holding(out);
    struct stat fst;
    if (::stat(folder.c_str(), &fst) != 0 || !S_ISDIR(fst.st_mode)) {
      throw Error(ErrorCode::IoError,
                  context + ": its folder " + quote(folder) +
                      (::stat(folder.c_str(), &fst) != 0 ? " does not exist" : " is not a folder") +
                      "; create it first (GroupLin creates the output, not the folders above it)");
    }
    return;
  }
  if (src.holds_file(st.st_dev, st.st_ino)) {
    throw Error(ErrorCode::InvalidArgument,
                context + " is " + (src.directory() ? "a file of the input" : "the input file") +
                    "; refusing to overwrite it");
  }
  // Neither kind of output replaces the other, --force or not (as cp -r refuses).
  if (directory_out && !S_ISDIR(st.st_mode)) {
    throw Error(ErrorCode::InvalidArgument,
                context + " exists and is not a directory; a directory of shards never replaces " +
                    "it, with or without --force: choose another name, or remove it first");
  }
  if (!directory_out && S_ISDIR(st.st_mode)) {
    const std::string inside =
        (std::filesystem::path(out) / std::filesystem::path(in).filename()).string();
    throw Error(ErrorCode::InvalidArgument,
                context + " is a directory, and " +
                    (src.directory() ? "its name has a file extension, so a file was asked for: "
                                       "name the output directory without the extension"
                                     : "a file input converts to a file: name the file, e.g. " +
                                           quote(inside)));
  }
  if (!directory_out && !S_ISREG(st.st_mode)) {
    throw Error(ErrorCode::InvalidArgument, context + " exists and is not a regular file");
  }
  if (!overwrite) {
    throw Error(ErrorCode::InvalidArgument,
                context + " already exists; not replacing it unless asked to (--force)");
  }
  if (directory_out && S_ISDIR(st.st_mode)) check_replaceable_directory(in, out, src);
}

// The one layout of `dict`'s grouped modules, for a conversion that keeps it (Single when there
// are none); Error(InvalidArgument) when they are in both.
ExpertLayout kept_layout(const StateDict& dict, const PlanOptions& options) {
  const GroupedScan scan = layout::scan(dict, options);
  std::string single, per_expert;
  for (const GroupedModule& m : scan.modules) {
    std::string& names = m.layout == ExpertLayout::Single && !m.mixed ? single : per_expert;
    if (names.size() < 200) names += (names.empty() ? "" : ", ") + quote(m.prefix);
  }
  if (!single.empty() && !per_expert.empty()) {
    throw Error(ErrorCode::InvalidArgument,
                "no --layout keeps the layout of the grouped modules, but they have two: single (" +
                    single + ") and per-expert or mixed (" + per_expert +
                    "); name the layout of the output (--layout single|per-expert)");
  }
  return per_expert.empty() ? ExpertLayout::Single : ExpertLayout::PerExpert;
}

// Never a silent no-op (docs/cli.md, "Nothing to change"): a conversion asked for a change it
// cannot make at all is an error; one that makes some of what was asked warns about the rest.
void refuse_no_ops(const ConvertOptions& options, ExpertLayout target,
                   const detail::CheckpointSource& src, const ConversionPlan& plan,
                   CheckpointFormat format, bool directory_out, const std::string& model_type,
                   ConvertReport& report) {
  const bool dequantized = report.dequantized > 0;
  // What changes besides the dtype: the files (format, sharding), or a module's layout or experts.
  const bool reshaped = format != src.format() || directory_out != (src.directory() != nullptr) ||
                        options.max_shard_size.has_value();
  const bool regrouped =
      options.experts.has_value() ||
      std::any_of(plan.modules.begin(), plan.modules.end(),
                  [&](const GroupedModule& m) { return m.mixed || m.layout != target; });
  const std::string rules = report.rules_from == RulesFrom::Given ? "the rules given"
                            : report.rules_from == RulesFrom::ModelType
                                ? "the rules of model type " + quote(model_type)
                                : "the rules detected from its names";
  if (!options.layout && !reshaped && !dequantized && !regrouped) {
    throw Error(ErrorCode::NothingToChange,
                "the layout kept (no --layout), the same format and sharding, no --dtype and no "
                "--experts: the output would be a copy of the input (cp makes one)");
  }
  if (plan.modules.empty() && options.layout) {
    if (options.experts) {
      throw Error(ErrorCode::NoGroupedModules,
                  "--experts " + std::to_string(options.experts->begin) + ":" +
                      std::to_string(options.experts->end) + ": no grouped module found by " +
                      rules + ", so there are no experts to take (--rules names the rules; " +
                      "`grouplin rules` lists them)");
    }
    const std::string layout(layout_name(target));
    if (!reshaped && !dequantized) {
      throw Error(ErrorCode::NoGroupedModules,
                  "no grouped module found by " + rules + ": converting to the " + layout +
                      " layout would change nothing (--rules names the rules; `grouplin rules` " +
                      "lists them)");
    }
    report.warnings.push_back({ErrorCode::NoGroupedModules, "",
                               "no grouped module found by " + rules + ": the " + layout +
                                   " layout changed nothing; every tensor is written as it is"});
  }
  if (options.dtype && !dequantized) {
    const std::string what = "--dtype " + std::string(dtype_name(*options.dtype)) +
                             ": no FP8 weight with its scales (W and W_scale_inv) to write as "
                             "values";
    if (!reshaped && !regrouped) throw Error(ErrorCode::NothingToDequantize, what);
    report.warnings.push_back({ErrorCode::NothingToDequantize, "", what + "; nothing dequantized"});
  }
  if (options.dtype) {
    for (const std::string& name : layout::scales_without_weight(src.tensors(), plan.modules)) {
      report.warnings.push_back(
          {ErrorCode::ScaleWithoutWeight, name,
           quote(name) + ": FP8 scales without their weight " + quote(*core::fp8_weight_of(name)) +
               " in the input; nothing dequantizes with them: written as they are"});
    }
  }
}

}  // namespace

ConvertReport convert_checkpoint(const std::string& in, const std::string& out,
                                 const ConvertOptions& options) {
  const std::string context = "converting " + quote(in);
  PtReadOptions pt;
  pt.state_dict_key = options.state_dict_key;
  std::unique_ptr<detail::CheckpointSource> src = detail::CheckpointSource::open(in, pt);
  const std::optional<CheckpointFormat> out_extension = format_for_extension(out);
  const bool directory_out =
      options.max_shard_size.has_value() || (src->directory() && !out_extension);
  if (options.max_shard_size && *options.max_shard_size == 0) {
    throw Error(ErrorCode::InvalidArgument, context + ": a largest shard size of 0 bytes");
  }
  // An output named as a file of one format is that file (docs/cli.md, "Output paths").
  if (options.max_shard_size && out_extension) {
    throw Error(ErrorCode::InvalidArgument,
                context + ": --max-shard-size writes a directory of shards, but the output " +
                    quote(out) + " is named as a " + std::string(format_name(*out_extension)) +
                    " file; name the directory without the extension, or leave out "
                    "--max-shard-size for one file");
  }
  // (.bin is any binary file: --format decides it.)
  const bool weak_extension = std::filesystem::path(out).extension() == ".bin";
  if (!directory_out && options.format && out_extension && !weak_extension &&
      *options.format != *out_extension) {
    throw Error(ErrorCode::InvalidArgument, context + ": the output " + quote(out) +
                                                " is named as a " +
                                                std::string(format_name(*out_extension)) +
                                                " file, but the format asked for is " +
                                                std::string(format_name(*options.format)) +
                                                "; rename the output or leave out --format");
  }
  check_output(in, out, *src, directory_out, options.overwrite);
  std::optional<CheckpointFormat> format = options.format;
  if (!format && directory_out) format = src->format();
  if (!format) format = out_extension;
  if (!format) {
    throw Error(ErrorCode::UnknownFormat,
                context + ": the extension of " + quote(out) +
                    " names no checkpoint format (.safetensors, .pt, .pth, .bin); give the "
                    "format (--format safetensors|pt), or convert a directory to a directory");
  }

  ConversionPlan plan;
  ConvertReport report;
  const std::string model_type =
      options.model_type.empty() ? src->model_type() : options.model_type;
  report.rules_from = !options.rules.empty()                         ? RulesFrom::Given
                      : rules_for_model_type(model_type).has_value() ? RulesFrom::ModelType
                                                                     : RulesFrom::Names;
  try {
    const PlanOptions plan_options{options.rules, model_type, options.experts,
                                   src->declared_modules(), options.dtype.has_value()};
    report.layout = options.layout ? *options.layout : kept_layout(src->tensors(), plan_options);
    plan = plan_conversion(src->tensors(), report.layout, plan_options);
    if (options.dtype) {
      report.dequantized =
          layout::dequantize_plan(plan.tensors, *options.dtype, layout::MissingScales::Refuse);
    }
    refuse_no_ops(options, report.layout, *src, plan, *format, directory_out, model_type, report);
  } catch (const Error& e) {
    throw Error(e.code(), context + ": " + e.message());
  }

  report.input_format = src->format();
  report.output_format = *format;
  report.directory_output = directory_out;
  report.modules = plan.modules;
  for (const GroupedModule& m : plan.modules) {
    if (std::find(report.rules.begin(), report.rules.end(), m.rules) == report.rules.end()) {
      report.rules.push_back(m.rules);
    }
  }
  report.input_tensors = src->tensors().size();
  report.output_tensors = plan.tensors.size();
  report.warnings.insert(report.warnings.begin(), src->warnings().begin(), src->warnings().end());
  // A safetensors output keeps the input's metadata, with GroupLin's declaration of the modules
  // that detection could not find again without it made anew (every shard of a directory holds
  // the same). A .pt file has no metadata to keep or declare in.
  std::map<std::string, std::string> metadata =
      with_declared_modules(src->metadata(), plan.to_declare);
  // The family that converted it names its rules next time too (kModelTypeKey): a file output
  // has no config.json beside it (a directory output gets the input's).
  if (report.rules_from == RulesFrom::ModelType && !plan.modules.empty() && !directory_out) {
    metadata[kModelTypeKey] = model_type;
  }
  if (!plan.unconfirmed.empty()) {
    const UnconfirmedStack& u = plan.unconfirmed.front();
    const size_t more = plan.unconfirmed.size() - 1;
    report.warnings.push_back(
        {ErrorCode::NoGroupedModules, u.name,
         quote(u.name) +
             (more ? " and " + std::to_string(more) + " more stacked tensor(s) left as they are"
                   : " left as it is") +
             ": " + u.reason()});
  }
  if (*format == CheckpointFormat::Pt && !plan.to_declare.empty()) {
    std::string rules;
    for (const GroupedModule& m : plan.modules) {
      if (m.prefix == plan.to_declare.front()) rules = m.rules;
    }
    report.warnings.push_back(
        {ErrorCode::NoGroupedModules, plan.to_declare.front(),
         std::to_string(plan.to_declare.size()) + " grouped module(s) of the output (the first " +
             quote(plan.to_declare.front()) +
             ") are stacked tensors alone, without the entry that tells them from a convolution "
             "(TransformerEngine's _extra_state); a .pt file has no metadata to declare them in, "
             "so reading the output back takes the rules by name (--rules " +
             rules + "); a safetensors output declares them"});
  }
  for (const PlannedTensor& t : plan.tensors) report.data_bytes += t.nbytes();
  // The tensor bytes at least (an old OUT is replaced only once the new one is complete).
  detail::require_free_space(out, report.data_bytes, context);

  Progress progress(options, report.data_bytes);
  if (directory_out) {
    write_directory(in, out, *src, plan, *format, metadata,
                    options.max_shard_size.value_or(kDefaultMaxShardSize), options.overwrite,
                    progress, report);
  } else {
    report.file_bytes = write_file(out, *src, plan.tensors, *format, metadata, progress);
    report.output_files.push_back(std::filesystem::path(out).filename().string());
    // A file holds tensors only: what else the input directory had stays there.
    if (const detail::CheckpointDir* dir = src->directory()) report.left_files = dir->other_files;
  }
  return report;
}

}  // namespace grouplin
