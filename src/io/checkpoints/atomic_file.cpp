#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <random>

#include "grouplin/error.hpp"
#include "grouplin/file.hpp"
#include "io/checkpoints/commit_calls.hpp"
#include "io/checkpoints/stale_temporaries.hpp"

namespace grouplin {
namespace {

// One write() moves at most this much (Linux caps a single write near 2 GiB anyway).
constexpr size_t kMaxWriteChunk = size_t{1} << 30;
// Attempts at a fresh temporary name before giving up (a clash needs the same pid and 64 random
// bits, so more than one attempt only matters against a hostile folder).
constexpr int kTempNameAttempts = 16;

Error io_error(const std::string& what, int err) {
  return Error(ErrorCode::IoError, what + ": " + std::strerror(err));
}

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

}  // namespace

namespace detail {

int CommitCalls::flush(int fd) { return ::fsync(fd) == 0 ? 0 : errno; }

int CommitCalls::close(int fd) { return ::close(fd) == 0 ? 0 : errno; }

int CommitCalls::rename(const std::string& from, const std::string& to) {
  return ::rename(from.c_str(), to.c_str()) == 0 ? 0 : errno;
}

int CommitCalls::flush_folder(const std::string& folder) noexcept {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno;
  const int err = ::fsync(fd) == 0 ? 0 : errno;
  ::close(fd);
  // Some file systems cannot fsync a directory (EINVAL): nothing more can be done there.
  return err == EINVAL ? 0 : err;
}

CommitCalls& CommitCalls::system() {
  static CommitCalls calls;
  return calls;
}

std::unique_ptr<AtomicFile> create_atomic_file(const std::string& path, CommitCalls& calls) {
  // A file we replace keeps its permission bits; a new one gets 0666 minus the umask.
  struct stat old;
  bool replacing = ::stat(path.c_str(), &old) == 0 && S_ISREG(old.st_mode);

  const size_t slash = path.find_last_of('/');
  remove_stale_temporaries(parent_folder(path),
                           slash == std::string::npos ? path : path.substr(slash + 1),
                           TempKind::File);
  std::string prefix = path + ".tmp." + std::to_string(::getpid()) + ".";
  for (int attempt = 0; attempt < kTempNameAttempts; ++attempt) {
    std::string temp = prefix + random_suffix();
    int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) {
      if (errno == EEXIST || errno == EINTR) continue;
      throw io_error("saving " + quote(path) + ": creating the temporary file " + quote(temp),
                     errno);
    }
    std::unique_ptr<AtomicFile> file(new AtomicFile(path, temp, fd, calls));
    if (replacing && ::fchmod(fd, old.st_mode & 07777) != 0) {
      throw io_error("saving " + quote(path) + ": setting the mode of " + quote(temp), errno);
    }
    return file;
  }
  throw Error(ErrorCode::IoError, "saving " + quote(path) + ": no free temporary name after " +
                                      std::to_string(kTempNameAttempts) + " attempts");
}

}  // namespace detail

std::unique_ptr<AtomicFile> AtomicFile::create(const std::string& path) {
  return detail::create_atomic_file(path, detail::CommitCalls::system());
}

AtomicFile::AtomicFile(std::string path, std::string temp_path, int fd, detail::CommitCalls& calls)
    : path_(std::move(path)), temp_path_(std::move(temp_path)), fd_(fd), calls_(calls) {}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

void AtomicFile::write(std::span<const std::byte> bytes) {
  if (fd_ < 0) {
    throw Error(ErrorCode::IoError, "saving " + quote(path_) + ": write after commit()");
  }
  const std::byte* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd_, p, std::min(left, kMaxWriteChunk));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw io_error("saving " + quote(path_) + ": writing " + quote(temp_path_) + " at byte " +
                         std::to_string(position_),
                     errno);
    }
    if (n == 0) {
      throw Error(ErrorCode::IoError, "saving " + quote(path_) + ": writing " + quote(temp_path_) +
                                          " at byte " + std::to_string(position_) +
                                          ": no progress");
    }
    auto done = static_cast<size_t>(n);  // a short write: loop for the rest
    p += done;
    left -= done;
    position_ += done;
  }
}

void AtomicFile::commit() {
  if (fd_ < 0) throw Error(ErrorCode::IoError, "saving " + quote(path_) + ": commit() twice");
  // Data first, then the name: after a crash the final name holds the old or the new file, whole.
  const std::string folder = parent_folder(path_);  // allocated before the commit point
  if (int err = calls_.flush(fd_)) {
    throw io_error("saving " + quote(path_) + ": flushing " + quote(temp_path_), err);
  }
  const int fd = fd_;
  fd_ = -1;
  if (int err = calls_.close(fd)) {
    throw io_error("saving " + quote(path_) + ": closing " + quote(temp_path_), err);
  }
  if (int err = calls_.rename(temp_path_, path_)) {
    throw io_error("saving " + quote(path_) + ": renaming " + quote(temp_path_) + " over it", err);
  }
  // The commit point: the file is in place under its final name. Nothing below may throw (a
  // caller told "failed" would believe the old file is still there); flushing the folder only
  // makes the rename durable, and its failure is kept for folder_flush_error().
  committed_ = true;
  folder_flush_errno_ = calls_.flush_folder(folder);
}

std::string AtomicFile::folder_flush_error() const {
  if (folder_flush_errno_ == 0) return "";
  return "saving " + quote(path_) + ": the file is in place, but flushing its folder " +
         quote(parent_folder(path_)) + " failed: " + std::strerror(folder_flush_errno_) +
         " (a crash soon after may bring back the old directory entry)";
}

}  // namespace grouplin
