// Opening an input checkpoint for streaming (see io/checkpoint_source.hpp).
#include "io/checkpoint_source.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "grouplin/error.hpp"
#include "grouplin/safetensors.hpp"

namespace grouplin::detail {

std::unique_ptr<CheckpointSource> CheckpointSource::open(const std::string& path,
                                                         const PtReadOptions& pt_options) {
  std::unique_ptr<CheckpointSource> src(new CheckpointSource());
  src->path_ = path;
  src->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (src->fd_ < 0) {
    throw Error(ErrorCode::IoError, "opening " + quote(path) + ": " + std::strerror(errno));
  }
  struct stat st;
  if (::fstat(src->fd_, &st) != 0) {
    throw Error(ErrorCode::IoError,
                "reading the size of " + quote(path) + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    throw Error(ErrorCode::IoError, "opening " + quote(path) + ": not a regular file");
  }
  src->size_ = static_cast<uint64_t>(st.st_size);
  src->device_ = st.st_dev;
  src->inode_ = st.st_ino;

  // Map the very file the descriptor holds (not whatever the name points to by now).
  const std::string self = "/proc/self/fd/" + std::to_string(src->fd_);
  try {
    src->mapping_ = MappedFile::open(::access(self.c_str(), R_OK) == 0 ? self : path);
  } catch (const Error& e) {
    throw Error(e.code(), "mapping " + quote(path) + ": " + e.message());
  }
  src->format_ = detect_format(path);
  std::shared_ptr<Storage> bytes = src->mapping_->storage(0, src->mapping_->size());
  if (src->format_ == CheckpointFormat::Pt) {
    src->tensors_ = parse_pt(bytes, path, pt_options);
  } else {
    SafetensorsLayout layout = parse_safetensors_layout({bytes->data(), bytes->size()}, path);
    src->metadata_ = std::move(layout.header.metadata);
    for (SafetensorsEntry& e : layout.header.entries) {
      src->tensors_.insert(std::move(e.name),
                           Tensor::view_of(bytes, layout.data_offset + e.begin, e.shape, e.dtype));
    }
  }
  return src;
}

CheckpointSource::~CheckpointSource() {
  if (fd_ >= 0) ::close(fd_);
}

std::optional<uint64_t> CheckpointSource::file_offset(const Tensor& t) const {
  // Pointer comparison across allocations is done on integers: the reader's copies are separate
  // heap blocks, never inside the mapping.
  const auto begin = reinterpret_cast<uintptr_t>(mapping_->data());
  const auto p = reinterpret_cast<uintptr_t>(t.data());
  if (p < begin || p - begin > mapping_->size() || t.nbytes() > mapping_->size() - (p - begin)) {
    return std::nullopt;
  }
  return static_cast<uint64_t>(p - begin);
}

void CheckpointSource::read(const Tensor& t, uint64_t at, std::span<std::byte> dst) const {
  std::optional<uint64_t> offset = file_offset(t);
  if (!offset) {
    if (!dst.empty()) std::memcpy(dst.data(), t.data() + at, dst.size());
    return;
  }
  uint64_t pos = *offset + at;
  std::byte* p = dst.data();
  size_t left = dst.size();
  while (left > 0) {
    ssize_t n = ::pread(fd_, p, left, static_cast<off_t>(pos));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorCode::IoError, "reading " + quote(path_) + " at byte " +
                                          std::to_string(pos) + ": " + std::strerror(errno));
    }
    if (n == 0) {
      throw Error(ErrorCode::Truncated, "reading " + quote(path_) + " at byte " +
                                            std::to_string(pos) +
                                            ": the file ended (was it changed while reading?)");
    }
    p += n;
    left -= static_cast<size_t>(n);
    pos += static_cast<uint64_t>(n);
  }
}

}  // namespace grouplin::detail
