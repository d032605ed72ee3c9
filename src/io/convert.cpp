// Streaming checkpoint conversion (see grouplin/convert.hpp): plan everything, then write OUT
// front to back from byte ranges of IN.
#include "grouplin/convert.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "grouplin/error.hpp"
#include "grouplin/file.hpp"
#include "grouplin/safetensors.hpp"
#include "io/checkpoint_source.hpp"
#include "io/pt_writer.hpp"
#include "io/zip.hpp"

namespace grouplin {
namespace {

// Bytes per copy_file_range call and per progress report. Larger calls gain nothing measurable
// (the kernel copies 1 GiB at 1.9-3 GB/s either way on the dev machine); 64 MiB keeps the
// progress bar moving several times a second.
constexpr uint64_t kCopyChunk = uint64_t{64} << 20;
// Bytes per pread of the CRC worker (below): 1 MiB stays in the L2 cache between the read and
// the CRC.
constexpr size_t kReadChunk = size_t{1} << 20;
// How far the CRC worker may read ahead of the writer.
constexpr uint64_t kCrcLead = uint64_t{256} << 20;

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

// Calls the user's progress callback with a running total.
class Progress {
 public:
  Progress(const ConvertOptions& options, uint64_t total) : fn_(options.progress), total_(total) {
    report(0);
  }
  void advance(uint64_t n) { report(done_ += n); }
  uint64_t done() const { return done_; }

 private:
  void report(uint64_t done) {
    if (fn_) fn_(done, total_);
  }
  const std::function<void(uint64_t, uint64_t)>& fn_;
  uint64_t total_;
  uint64_t done_ = 0;
};

// Appends pieces to a sink: file ranges that follow each other in IN become one in-kernel copy,
// bytes in memory are written as they are.
class RangeWriter {
 public:
  RangeWriter(FileSink& sink, const detail::CheckpointSource& src, Progress& progress)
      : sink_(sink), src_(src), progress_(progress) {}

  void add(const Tensor& piece) {
    const uint64_t n = piece.nbytes();
    if (n == 0) return;
    if (std::optional<uint64_t> at = src_.file_offset(piece)) {
      if (pending_len_ != 0 && pending_at_ + pending_len_ == *at) {
        pending_len_ += n;
      } else {
        flush();
        pending_at_ = *at;
        pending_len_ = n;
      }
      return;
    }
    flush();
    for (uint64_t at = 0; at < n; at += kCopyChunk) {
      const uint64_t len = std::min(kCopyChunk, n - at);
      sink_.write({piece.data() + at, static_cast<size_t>(len)});
      progress_.advance(len);
    }
  }

  void flush() {
    while (pending_len_ != 0) {
      const uint64_t len = std::min(kCopyChunk, pending_len_);
      sink_.copy_from_file(src_.fd(), pending_at_, len);
      pending_at_ += len;
      pending_len_ -= len;
      progress_.advance(len);
    }
  }

 private:
  FileSink& sink_;
  const detail::CheckpointSource& src_;
  Progress& progress_;
  uint64_t pending_at_ = 0;
  uint64_t pending_len_ = 0;
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
  RangeWriter out(sink, src, progress);
  for (size_t k : layout.order) {
    for (const Tensor& piece : plan.tensors[k].pieces) out.add(piece);
  }
  out.flush();
}

// The CRC-32 of every record of a .pt OUT, computed on a second thread while the main thread
// copies the same bytes inside the kernel: the zip format wants each record's CRC, and reading the
// bytes into this process only for that, on the writing thread, cost ~20% of the throughput.
// The worker reads (pread, kReadChunk at a time, from the page cache the copy also reads) at most
// kCrcLead bytes ahead of the writer, so that on a file larger than memory both touch a page
// while it is cached.
class CrcWorker {
 public:
  CrcWorker(const detail::CheckpointSource& src, const ConversionPlan& plan)
      : src_(src), plan_(plan), crcs_(plan.tensors.size()), thread_([this] { run(); }) {}
  ~CrcWorker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  CrcWorker(const CrcWorker&) = delete;
  CrcWorker& operator=(const CrcWorker&) = delete;

  // The writer has written `n` more bytes.
  void written(uint64_t n) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      written_ += n;
    }
    changed_.notify_all();
  }

  // CRC-32 of record k, once computed. Rethrows the worker's error.
  uint32_t crc(size_t k) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return ready_ > k || error_; });
    if (error_) std::rethrow_exception(error_);
    return crcs_[k];
  }

 private:
  void run() {
    try {
      std::vector<std::byte> buffer(kReadChunk);
      for (size_t k = 0; k < plan_.tensors.size(); ++k) {
        uint32_t crc = 0;
        for (const Tensor& piece : plan_.tensors[k].pieces) {
          const uint64_t n = piece.nbytes();
          for (uint64_t at = 0; at < n; at += kReadChunk) {
            const size_t len = static_cast<size_t>(std::min<uint64_t>(kReadChunk, n - at));
            {
              std::unique_lock<std::mutex> lock(mutex_);
              changed_.wait(lock, [&] { return stop_ || read_ < written_ + kCrcLead; });
              if (stop_) return;
            }
            src_.read(piece, at, std::span(buffer.data(), len));
            crc = zip::crc32(crc, std::span(buffer.data(), len));
            std::lock_guard<std::mutex> lock(mutex_);
            read_ += len;
          }
        }
        {
          std::lock_guard<std::mutex> lock(mutex_);
          crcs_[k] = crc;
          ready_ = k + 1;
        }
        changed_.notify_all();
      }
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        error_ = std::current_exception();
      }
      changed_.notify_all();
    }
  }

  const detail::CheckpointSource& src_;
  const ConversionPlan& plan_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<uint32_t> crcs_;
  size_t ready_ = 0;        // records whose CRC is in crcs_
  uint64_t read_ = 0;       // bytes the worker has read
  uint64_t written_ = 0;    // bytes the writer has written
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;      // last: starts once everything above exists
};

void write_pt_out(FileSink& sink, const detail::CheckpointSource& src,
                  const ConversionPlan& plan, Progress& progress) {
  // One record per tensor, numbered in dict order, as save_pt writes tensors that share nothing.
  std::vector<detail::PtTensorSpec> tensors;
  std::vector<detail::PtRecordSpec> records;
  tensors.reserve(plan.tensors.size());
  records.reserve(plan.tensors.size());
  for (size_t k = 0; k < plan.tensors.size(); ++k) {
    const PlannedTensor& t = plan.tensors[k];
    tensors.push_back({t.name, t.dtype, t.shape, k, 0});
    records.push_back({std::to_string(k), t.nbytes()});
  }
  CrcWorker crcs(src, plan);
  detail::write_pt_archive(
      sink, tensors, records, [&](size_t k, zip::ZipWriter& zip) -> std::optional<uint32_t> {
        for (const Tensor& piece : plan.tensors[k].pieces) {
          const uint64_t n = piece.nbytes();
          const std::optional<uint64_t> in_file = src.file_offset(piece);
          for (uint64_t at = 0; at < n; at += kCopyChunk) {
            const uint64_t len = std::min(kCopyChunk, n - at);
            if (in_file) {
              zip.copy_from_file(src.fd(), *in_file + at, len);
            } else {
              zip.write({piece.data() + at, static_cast<size_t>(len)});
            }
            crcs.written(len);
            progress.advance(len);
          }
        }
        return crcs.crc(k);
      });
}

// Refuses OUT when it is IN, or exists and may not be replaced.
void check_output(const std::string& in, const std::string& out,
                  const detail::CheckpointSource& src, bool overwrite) {
  struct stat st;
  if (::stat(out.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw Error(ErrorCode::IoError,
                "converting " + quoted(in) + ": checking " + quoted(out) + ": " +
                    std::strerror(errno));
  }
  if (st.st_dev == src.device() && st.st_ino == src.inode()) {
    throw Error(ErrorCode::InvalidArgument, "converting " + quoted(in) + ": the output " +
                                                quoted(out) +
                                                " is the input file; refusing to overwrite it");
  }
  if (!S_ISREG(st.st_mode)) {
    throw Error(ErrorCode::InvalidArgument, "converting " + quoted(in) + ": the output " +
                                                quoted(out) + " exists and is not a regular file");
  }
  if (!overwrite) {
    throw Error(ErrorCode::InvalidArgument,
                "converting " + quoted(in) + ": the output " + quoted(out) +
                    " already exists; not replacing it unless asked to (--force)");
  }
}

}  // namespace

ConvertReport convert_checkpoint(const std::string& in, const std::string& out,
                                 const ConvertOptions& options) {
  const std::string context = "converting " + quoted(in);
  std::unique_ptr<detail::CheckpointSource> src = detail::CheckpointSource::open(in);
  check_output(in, out, *src, options.overwrite);
  std::optional<CheckpointFormat> format = options.format;
  if (!format) format = format_for_extension(out);
  if (!format) {
    throw Error(ErrorCode::UnknownFormat,
                context + ": the extension of " + quoted(out) +
                    " names no checkpoint format (.safetensors, .pt, .pth, .bin); give the "
                    "format (--format safetensors|pt)");
  }

  ConversionPlan plan;
  try {
    plan = plan_conversion(src->tensors(), options.layout);
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
    write_safetensors_out(*file, *src, plan, src->metadata(), "saving " + quoted(out), progress);
  } else {
    write_pt_out(*file, *src, plan, progress);
  }
  report.file_bytes = file->position();
  file->commit();
  return report;
}

}  // namespace grouplin
