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

std::string CheckpointSource::describe_range(const Tensor& piece, uint64_t pos) const {
  // The input tensor holding byte `pos` (a piece may be one expert's slice of a stacked tensor).
  for (const auto& [name, t] : tensors_) {
    const std::optional<uint64_t> begin = file_offset(t);
    if (begin && pos >= *begin && pos - *begin < t.nbytes()) {
      return "tensor " + quote(name) + " lies at bytes [" + std::to_string(*begin) + ", " +
             std::to_string(*begin + t.nbytes()) + ") of the file";
    }
  }
  const uint64_t begin = file_offset(piece).value_or(0);
  return "tensor bytes [" + std::to_string(begin) + ", " + std::to_string(begin + piece.nbytes()) +
         ") of the file";
}

void CheckpointSource::read(const Tensor& t, uint64_t at, std::span<std::byte> dst) const {
  std::optional<uint64_t> offset = file_offset(t);
  if (!offset) {
    if (!dst.empty()) std::memcpy(dst.data(), t.data() + at, dst.size());
    return;
  }
  // pread, never the mapping: bytes past a new end of the file (another program truncated it)
  // are a short read here, where touching them through the mapping would raise SIGBUS.
  uint64_t pos = *offset + at;
  std::byte* p = dst.data();
  size_t left = dst.size();
  while (left > 0) {
    ssize_t n = ::pread(fd_, p, left, static_cast<off_t>(pos));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      throw Error(ErrorCode::IoError, "reading " + quote(path_) + ": " + describe_range(t, pos) +
                                          "; reading byte " + std::to_string(pos) + ": " +
                                          std::strerror(err));
    }
    if (n == 0) {
      struct stat st;
      const std::string now = ::fstat(fd_, &st) == 0 ? "it now has " + std::to_string(st.st_size)
                                                     : "its size cannot be read now, it had";
      throw Error(ErrorCode::Truncated, "reading " + quote(path_) + ": " + describe_range(t, pos) +
                                            ", but the file ended at byte " + std::to_string(pos) +
                                            ": " + now + " bytes, " + std::to_string(size_) +
                                            " when opened (was it changed while being read?)");
    }
    p += n;
    left -= static_cast<size_t>(n);
    pos += static_cast<uint64_t>(n);
  }
}

}  // namespace grouplin::detail
