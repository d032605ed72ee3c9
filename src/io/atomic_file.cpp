#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "grouplin/error.hpp"
#include "grouplin/file.hpp"

namespace grouplin {
namespace {

// One write() moves at most this much (Linux caps a single write near 2 GiB anyway).
constexpr size_t kMaxWriteChunk = size_t{1} << 30;
// FileSink::copy_from_file's buffer: large enough that syscalls cost nothing, small enough to stay
// in the L2 cache between the read and the write.
constexpr size_t kCopyBuffer = size_t{1} << 20;
// Attempts at a fresh temporary name before giving up (a clash needs the same pid and 64 random
// bits, so more than one attempt only matters against a hostile folder).
constexpr int kTempNameAttempts = 16;

Error io_error(const std::string& what, int err) {
  return Error(ErrorCode::IoError, what + ": " + std::strerror(err));
}

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

// The folder holding `path` ("." for a bare file name).
std::string parent_folder(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string random_suffix() {
  std::random_device rd;
  uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016" PRIx64, r);
  return hex;
}

// Makes a rename in `folder` durable: without this a power loss right after commit() may bring
// back the old directory entry.
void fsync_folder(const std::string& folder, const std::string& path) {
  int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    throw io_error("saving " + quoted(path) + ": opening its folder " + quoted(folder), errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems cannot fsync a directory (EINVAL); the rename itself has happened.
  if (rc != 0 && err != EINVAL) {
    throw io_error("saving " + quoted(path) + ": flushing its folder " + quoted(folder), err);
  }
}

}  // namespace

std::unique_ptr<AtomicFile> AtomicFile::create(const std::string& path) {
  // A file we replace keeps its permission bits; a new one gets 0666 minus the umask.
  struct stat old;
  bool replacing = ::stat(path.c_str(), &old) == 0 && S_ISREG(old.st_mode);

  std::string prefix = path + ".tmp." + std::to_string(::getpid()) + ".";
  for (int attempt = 0; attempt < kTempNameAttempts; ++attempt) {
    std::string temp = prefix + random_suffix();
    int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) {
      if (errno == EEXIST || errno == EINTR) continue;
      throw io_error("saving " + quoted(path) + ": creating the temporary file " + quoted(temp),
                     errno);
    }
    std::unique_ptr<AtomicFile> file(new AtomicFile(path, temp, fd));
    if (replacing && ::fchmod(fd, old.st_mode & 07777) != 0) {
      throw io_error("saving " + quoted(path) + ": setting the mode of " + quoted(temp), errno);
    }
    return file;
  }
  throw Error(ErrorCode::IoError, "saving " + quoted(path) + ": no free temporary name after " +
                                      std::to_string(kTempNameAttempts) + " attempts");
}

AtomicFile::AtomicFile(std::string path, std::string temp_path, int fd)
    : path_(std::move(path)), temp_path_(std::move(temp_path)), fd_(fd) {}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

void AtomicFile::write(std::span<const std::byte> bytes) {
  if (fd_ < 0) {
    throw Error(ErrorCode::IoError, "saving " + quoted(path_) + ": write after commit()");
  }
  const std::byte* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd_, p, std::min(left, kMaxWriteChunk));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw io_error("saving " + quoted(path_) + ": writing " + quoted(temp_path_) + " at byte " +
                         std::to_string(position_),
                     errno);
    }
    if (n == 0) {
      throw Error(ErrorCode::IoError, "saving " + quoted(path_) + ": writing " +
                                          quoted(temp_path_) + " at byte " +
                                          std::to_string(position_) + ": no progress");
    }
    auto done = static_cast<size_t>(n);  // a short write: loop for the rest
    p += done;
    left -= done;
    position_ += done;
  }
}

void FileSink::copy_from_file(int fd, uint64_t offset, uint64_t len) {
  std::vector<std::byte> buffer(std::min<uint64_t>(len, kCopyBuffer));
  while (len > 0) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(len, buffer.size()));
    ssize_t n = ::pread(fd, buffer.data(), want, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw io_error("copying bytes at offset " + std::to_string(offset) + " of an input file",
                     errno);
    }
    if (n == 0) {
      throw Error(ErrorCode::Truncated, "copying bytes at offset " + std::to_string(offset) +
                                            ": the input file ends there, " + std::to_string(len) +
                                            " bytes short");
    }
    write(std::span(buffer.data(), static_cast<size_t>(n)));
    offset += static_cast<uint64_t>(n);
    len -= static_cast<uint64_t>(n);
  }
}

void AtomicFile::copy_from_file(int fd, uint64_t offset, uint64_t len) {
  if (fd_ < 0) {
    throw Error(ErrorCode::IoError, "saving " + quoted(path_) + ": write after commit()");
  }
  while (len > 0) {
    auto in = static_cast<loff_t>(offset);
    ssize_t n = ::copy_file_range(fd, &in, fd_, nullptr,
                                  static_cast<size_t>(std::min<uint64_t>(len, kMaxWriteChunk)), 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      // Kernels or file systems that cannot do it (cross-device before 5.3, special files, ...).
      if (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP ||
          errno == EBADF) {
        FileSink::copy_from_file(fd, offset, len);
        return;
      }
      throw io_error("saving " + quoted(path_) + ": copying into " + quoted(temp_path_) +
                         " at byte " + std::to_string(position_),
                     errno);
    }
    if (n == 0) {
      throw Error(ErrorCode::Truncated, "saving " + quoted(path_) + ": the input file ends at byte " +
                                            std::to_string(offset) + ", " + std::to_string(len) +
                                            " bytes short of the range to copy");
    }
    offset += static_cast<uint64_t>(n);
    len -= static_cast<uint64_t>(n);
    position_ += static_cast<uint64_t>(n);
  }
}

void AtomicFile::commit() {
  if (fd_ < 0) throw Error(ErrorCode::IoError, "saving " + quoted(path_) + ": commit() twice");
  // Data first, then the name: after a crash the final name holds the old or the new file, whole.
  if (::fsync(fd_) != 0) {
    throw io_error("saving " + quoted(path_) + ": flushing " + quoted(temp_path_), errno);
  }
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    throw io_error("saving " + quoted(path_) + ": closing " + quoted(temp_path_), errno);
  }
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    throw io_error("saving " + quoted(path_) + ": renaming " + quoted(temp_path_) + " over it",
                   errno);
  }
  committed_ = true;
  fsync_folder(parent_folder(path_), path_);
}

}  // namespace grouplin
