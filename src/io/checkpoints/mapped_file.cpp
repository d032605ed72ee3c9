#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "grouplin/error.hpp"
#include "grouplin/file.hpp"

namespace grouplin {
namespace {

// An empty file is not mapped (mmap refuses length 0); its data() points here instead, so that
// data() is never null.
const std::byte kEmptyFile[1] = {};

std::string os_error(const std::string& what, const std::string& path, int err) {
  return what + " " + quote(path) + ": " + std::strerror(err);
}

// Closes a descriptor when the scope ends, whatever happens.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() { ::close(fd_); }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

}  // namespace

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path, MapMode mode) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(ErrorCode::IoError, os_error("opening", path, errno));
  FdCloser closer(fd);

  struct stat st;
  if (::fstat(fd, &st) != 0)
    throw Error(ErrorCode::IoError, os_error("reading the size of", path, errno));
  if (!S_ISREG(st.st_mode)) {
    throw Error(ErrorCode::IoError, "opening " + quote(path) + ": not a regular file");
  }
  if (static_cast<uint64_t>(st.st_size) > std::numeric_limits<size_t>::max()) {
    throw Error(ErrorCode::IoError, "opening " + quote(path) + ": file of " +
                                        std::to_string(st.st_size) +
                                        " bytes does not fit in the address space");
  }
  auto size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    return std::shared_ptr<MappedFile>(new MappedFile(path, kEmptyFile, 0, MapMode::ReadOnly));
  }

  // MAP_PRIVATE: no write through this mapping reaches the file; with PROT_READ alone nobody can
  // write at all, with PROT_WRITE a write copies its page into this process. The descriptor can
  // be closed right away; the mapping keeps the file (its inode) alive, even if it is renamed over.
  const int prot = mode == MapMode::CopyOnWrite ? PROT_READ | PROT_WRITE : PROT_READ;
  void* p = ::mmap(nullptr, size, prot, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) throw Error(ErrorCode::IoError, os_error("mapping", path, errno));
  return std::shared_ptr<MappedFile>(
      new MappedFile(path, static_cast<const std::byte*>(p), size, mode));
}

MappedFile::MappedFile(std::string path, const std::byte* data, size_t size, MapMode mode)
    : path_(std::move(path)), data_(data), size_(size), mode_(mode) {}

MappedFile::~MappedFile() {
  if (size_ != 0) ::munmap(const_cast<std::byte*>(data_), size_);
}

void MappedFile::will_need(size_t offset, size_t len) const {
  if (offset >= size_ || len == 0) return;
  len = std::min(len, size_ - offset);
  // madvise wants a page-aligned start; the mapping itself starts on a page boundary.
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  size_t begin = offset / page * page;
  size_t end = offset + len;
  void* start = const_cast<std::byte*>(data_ + begin);
  // A hint: an error changes speed, never results. Measured on a 1 GiB file, load + sum of all
  // bytes, kernel 6.18, 2 cores: the kernel already maps ~1 MiB per fault (large page-cache
  // folios; 64 KiB fault-around for small ones), and MADV_WILLNEED costs ~0.1 ms and changed
  // nothing measurable (warm 0.107 vs 0.106 s, cold ~0.49 vs ~0.51 s). Adding MADV_SEQUENTIAL
  // made a cold read ~1.8x slower (0.39 -> 0.70 s: 16x more faults); MADV_POPULATE_READ only moves
  // the fault cost into load and was slower cold. WILLNEED is kept for access out of file order.
  ::madvise(start, end - begin, MADV_WILLNEED);
}

std::shared_ptr<Storage> MappedFile::storage(size_t offset, size_t len) const {
  if (offset > size_ || len > size_ - offset) {
    throw Error(ErrorCode::OutOfBounds, "mapping of " + quote(path_) + ": bytes [" +
                                            std::to_string(offset) + ", +" + std::to_string(len) +
                                            ") are outside the file of " + std::to_string(size_) +
                                            " bytes");
  }
  if (mode_ == MapMode::CopyOnWrite) {
    // Mapped with PROT_WRITE (and never the empty file's placeholder: that is ReadOnly).
    return Storage::wrap_writable(const_cast<std::byte*>(data_) + offset, len, shared_from_this());
  }
  return Storage::wrap(data_ + offset, len, shared_from_this());
}

}  // namespace grouplin
