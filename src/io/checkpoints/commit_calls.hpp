// Private: the system calls with which AtomicFile::commit finishes a file, behind one small
// interface so that tests can make each step fail (tests/io/atomic_file_test.cpp) and
// AtomicDirectory can defer the flushes of the files it holds to its own commit.
//
//   struct FailingRename : grouplin::detail::CommitCalls {
//     int rename(const std::string&, const std::string&) override { return EIO; }
//   };
//   FailingRename calls;
//   auto f = grouplin::detail::create_atomic_file("out.safetensors", calls);
//   f->commit();  // Error(IoError): "... renaming ... over it: Input/output error"
#pragma once

#include <memory>
#include <string>

#include "grouplin/file.hpp"

namespace grouplin::detail {

// Each call returns 0 or an errno value. The base class makes the real calls; system() is the
// instance AtomicFile::create uses. Thread-safety: the base class holds no state.
class CommitCalls {
 public:
  virtual ~CommitCalls() = default;
  virtual int flush(int fd);  // fsync(fd)
  virtual int close(int fd);  // close(fd)
  virtual int rename(const std::string& from, const std::string& to);
  // Makes a rename in `folder` durable: opens the folder, fsyncs and closes it. EINVAL from fsync
  // (file systems that cannot flush a folder) counts as success. Runs after the commit point,
  // hence noexcept.
  virtual int flush_folder(const std::string& folder) noexcept;

  static CommitCalls& system();
};

// AtomicFile::create(path), with `calls` making the commit steps. `calls` must outlive the file.
// Throws as AtomicFile::create.
std::unique_ptr<AtomicFile> create_atomic_file(const std::string& path, CommitCalls& calls);

}  // namespace grouplin::detail
