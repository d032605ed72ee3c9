// Streaming checkpoint conversion (see grouplin/convert.hpp): plan everything, then write OUT
// front to back from byte ranges of IN.
#include "grouplin/convert.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "grouplin/error.hpp"
#include "grouplin/file.hpp"
#include "grouplin/safetensors.hpp"
#include "io/checkpoint_source.hpp"
#include "io/pt_writer.hpp"
#include "io/tensor_stream.hpp"
#include "io/zip.hpp"

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
                           const ConversionPlan& plan,
                           const std::map<std::string, std::string>& metadata,
                           const std::string& context, Progress& progress) {
  std::vector<SafetensorsEntry> entries;
  entries.reserve(plan.tensors.size());
  for (const PlannedTensor& t : plan.tensors) entries.push_back({t.name, t.dtype, t.shape, 0, 0});
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
  detail::TensorStream stream(src, plan.tensors, layout.order, std::move(offsets),
                              /*crc=*/false);
  stream.drain(layout.data_size, [&](std::span<const std::byte> bytes) {
    sink.write(bytes);
    progress.advance(bytes.size());
  });
}

void write_pt_out(FileSink& sink, const detail::CheckpointSource& src, const ConversionPlan& plan,
                  const std::string& context, Progress& progress) {
  // One record per tensor, numbered in dict order, as save_pt writes tensors that share nothing.
  std::vector<detail::PtTensorSpec> tensors;
  std::vector<detail::PtRecordSpec> records;
  std::vector<size_t> order;
  tensors.reserve(plan.tensors.size());
  records.reserve(plan.tensors.size());
  for (size_t k = 0; k < plan.tensors.size(); ++k) {
    const PlannedTensor& t = plan.tensors[k];
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
  detail::TensorStream stream(src, plan.tensors, std::move(order), std::move(offsets),
                              /*crc=*/true);
  archive.write(sink, [&](size_t k, zip::ZipWriter& zip) -> std::optional<uint32_t> {
    stream.drain(records[k].nbytes, [&](std::span<const std::byte> bytes) {
      zip.write_without_crc(bytes);
      progress.advance(bytes.size());
    });
    return stream.crc(k);
  });
}

// Refuses OUT when it is IN, or exists and may not be replaced.
void check_output(const std::string& in, const std::string& out,
                  const detail::CheckpointSource& src, bool overwrite) {
  struct stat st;
  if (::stat(out.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw Error(ErrorCode::IoError, "converting " + quote(in) + ": checking " + quote(out) + ": " +
                                        std::strerror(errno));
  }
  if (st.st_dev == src.device() && st.st_ino == src.inode()) {
    throw Error(ErrorCode::InvalidArgument, "converting " + quote(in) + ": the output " +
                                                quote(out) +
                                                " is the input file; refusing to overwrite it");
  }
  if (!S_ISREG(st.st_mode)) {
    throw Error(ErrorCode::InvalidArgument, "converting " + quote(in) + ": the output " +
                                                quote(out) + " exists and is not a regular file");
  }
  if (!overwrite) {
    throw Error(ErrorCode::InvalidArgument,
                "converting " + quote(in) + ": the output " + quote(out) +
                    " already exists; not replacing it unless asked to (--force)");
  }
}

}  // namespace

ConvertReport convert_checkpoint(const std::string& in, const std::string& out,
                                 const ConvertOptions& options) {
  const std::string context = "converting " + quote(in);
  std::unique_ptr<detail::CheckpointSource> src = detail::CheckpointSource::open(in);
  check_output(in, out, *src, options.overwrite);
  std::optional<CheckpointFormat> format = options.format;
  if (!format) format = format_for_extension(out);
  if (!format) {
    throw Error(ErrorCode::UnknownFormat,
                context + ": the extension of " + quote(out) +
                    " names no checkpoint format (.safetensors, .pt, .pth, .bin); give the "
                    "format (--format safetensors|pt)");
  }

  ConversionPlan plan;
  try {
    plan = plan_conversion(src->tensors(), options.layout,
                           {options.rules, options.model_type, options.experts});
  } catch (const Error& e) {
    throw Error(e.code(), context + ": " + e.message());
  }

  ConvertReport report;
  report.input_format = src->format();
  report.output_format = *format;
  report.modules = plan.modules;
  report.input_tensors = src->tensors().size();
  report.output_tensors = plan.tensors.size();
  for (const PlannedTensor& t : plan.tensors) report.data_bytes += t.nbytes();

  std::unique_ptr<AtomicFile> file = AtomicFile::create(out);
  Progress progress(options, report.data_bytes);
  if (*format == CheckpointFormat::Safetensors) {
    // A .pt file has no metadata; a safetensors one keeps its own.
    write_safetensors_out(*file, *src, plan, src->metadata(), "saving " + quote(out), progress);
  } else {
    write_pt_out(*file, *src, plan, "saving " + quote(out), progress);
  }
  report.file_bytes = file->position();
  // A failure to flush the folder after the rename is not reported (folder_flush_error()): the
  // file is whole and in place, and the OS writes the folder entry back on its own.
  file->commit();
  return report;
}

}  // namespace grouplin
