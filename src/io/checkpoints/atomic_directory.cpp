// Building a directory out of sight and renaming it into place (see io/atomic_directory.hpp).
#include "io/checkpoints/atomic_directory.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "grouplin/error.hpp"
#include "grouplin/file.hpp"
#include "io/checkpoints/commit_calls.hpp"
#include "io/checkpoints/stale_temporaries.hpp"

namespace grouplin::detail {
namespace {

namespace fs = std::filesystem;

Error io_error(const std::string& what, int err) {
  return Error(ErrorCode::IoError, what + ": " + std::strerror(err));
}

// fsync of the file or folder at `path`; 0 or an errno value (EINVAL, a folder that cannot be
// flushed, counts as done).
int flush_path(const fs::path& path, bool folder) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (folder ? O_DIRECTORY : 0));
  if (fd < 0) return errno;
  const int err = ::fsync(fd) == 0 ? 0 : errno;
  ::close(fd);
  return err == EINVAL ? 0 : err;
}

}  // namespace

int AtomicDirectory::DeferredFlush::flush(int fd) {
  // Only a hint: a file system without it is flushed by commit() all the same.
  (void)::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
  return 0;
}

int AtomicDirectory::DeferredFlush::flush_folder(const std::string&) noexcept { return 0; }

fs::path without_trailing_separator(const fs::path& p) {
  return !p.has_filename() && p.has_parent_path() && p != p.root_path() ? p.parent_path() : p;
}

std::unique_ptr<AtomicDirectory> AtomicDirectory::create(const std::string& path) {
  const fs::path target = without_trailing_separator(fs::path(path).lexically_normal());
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  // Hidden and unique: "." + name + ".tmp.<pid>.<random>". mkdir, not mkdtemp: the directory
  // gets the permissions of any new one (0777 less the umask), not mkdtemp's 0700.
  // Appended piece by piece: GCC 12 warns falsely (-Wrestrict, its bug 105329) on "." + string.
  std::string stem = ".";
  stem += target.filename().string();
  remove_stale_temporaries(parent, stem, TempKind::Directory);
  stem += ".tmp." + std::to_string(::getpid()) + ".";
  std::random_device rd;
  for (int attempt = 0; attempt < 16; ++attempt) {
    const std::string temp = (parent / (stem + std::to_string(rd()))).string();
    if (::mkdir(temp.c_str(), 0777) == 0) {
      return std::unique_ptr<AtomicDirectory>(new AtomicDirectory(target.string(), temp));
    }
    if (errno != EEXIST) {
      throw io_error("saving " + quote(path) + ": creating the temporary directory " + quote(temp),
                     errno);
    }
  }
  throw Error(ErrorCode::IoError,
              "saving " + quote(path) + ": no free temporary directory name after 16 attempts");
}

AtomicDirectory::AtomicDirectory(std::string path, std::string temp)
    : path_(std::move(path)), temp_(std::move(temp)) {}

AtomicDirectory::~AtomicDirectory() {
  // After a committed exchange temp_ holds the replaced directory: removed as well.
  std::error_code ec;
  fs::remove_all(temp_, ec);
}

std::string AtomicDirectory::file(const std::string& relative) const {
  const fs::path p = fs::path(temp_) / relative;
  std::error_code ec;
  fs::create_directories(p.parent_path(), ec);
  if (ec) {
    throw Error(ErrorCode::IoError, "saving " + quote(path_) + ": creating the folder " +
                                        quote(p.parent_path().string()) + ": " + ec.message());
  }
  return p.string();
}

void AtomicDirectory::commit(bool replace) {
  if (committed_) throw Error(ErrorCode::IoError, "saving " + quote(path_) + ": commit() twice");
  // Every file's data, then every folder's entries: after a crash past the rename, `path_` holds
  // the whole new directory.
  std::error_code ec;
  std::vector<fs::path> folders = {temp_};
  for (fs::recursive_directory_iterator it(temp_, ec), end; !ec && it != end; it.increment(ec)) {
    const bool folder = it->is_directory();
    if (folder) folders.push_back(it->path());
    if (int err = folder ? 0 : flush_path(it->path(), false)) {
      throw io_error("saving " + quote(path_) + ": flushing " + quote(it->path().string()), err);
    }
  }
  if (ec) throw Error(ErrorCode::IoError, "saving " + quote(path_) + ": " + ec.message());
  for (const fs::path& f : folders) {
    if (int err = flush_path(f, true)) {
      throw io_error("saving " + quote(path_) + ": flushing " + quote(f.string()), err);
    }
  }
  const bool exists = fs::symlink_status(path_, ec).type() != fs::file_type::not_found;
  if (exists && !replace) {
    throw Error(ErrorCode::IoError, "saving " + quote(path_) + ": it exists (created meanwhile?)");
  }
  if (exists) {
    if (::renameat2(AT_FDCWD, temp_.c_str(), AT_FDCWD, path_.c_str(), RENAME_EXCHANGE) != 0) {
      const int err = errno;
      if (err != EINVAL && err != ENOSYS && err != ENOTSUP) {
        throw io_error("saving " + quote(path_) + ": exchanging " + quote(temp_) + " with it", err);
      }
      // A file system without exchange: the old entry is moved aside first, so there is a
      // moment without `path_`, never one with a part of the new directory.
      const std::string aside = temp_ + ".old";
      if (::rename(path_.c_str(), aside.c_str()) != 0) {
        throw io_error("saving " + quote(path_) + ": moving it aside to " + quote(aside), errno);
      }
      if (::rename(temp_.c_str(), path_.c_str()) != 0) {
        const int rename_err = errno;
        (void)::rename(aside.c_str(), path_.c_str());
        throw io_error("saving " + quote(path_) + ": renaming " + quote(temp_) + " to it",
                       rename_err);
      }
      temp_ = aside;  // removed by the destructor
    }
  } else if (int err = CommitCalls::system().rename(temp_, path_)) {
    throw io_error("saving " + quote(path_) + ": renaming " + quote(temp_) + " to it", err);
  }
  // The commit point. What the temporary name holds now (nothing, or the replaced directory) is
  // removed by the destructor; the parent folder's entry is flushed, a failure ignored as
  // AtomicFile::commit allows.
  committed_ = true;
  const fs::path parent = fs::path(path_).has_parent_path() ? fs::path(path_).parent_path() : ".";
  (void)CommitCalls::system().flush_folder(parent.string());
}

}  // namespace grouplin::detail
