// Private: a directory built beside its final place and renamed into it, so that readers see the
// old directory or the whole new one, never a part (convert's sharded output).
//
//   auto dir = grouplin::detail::AtomicDirectory::create("out-model");  // .out-model.tmp.<pid>.<n>
//   auto f = grouplin::detail::create_atomic_file(dir->file("model.safetensors"),
//                                                 dir->deferred_flush());
//   f->write(bytes);
//   f->commit();                     // in place in the temporary directory, write-back started
//   dir->commit(/*replace=*/false);  // fsync every file and folder, rename it to "out-model"
//   // destroyed without commit(): the temporary directory and all it holds are removed
//
// Files are flushed all at once at the end, not one by one: their write-back runs meanwhile, in
// the background. A 1.2 GB directory of 4 shards on the dev machine: each shard fsynced as it was
// finished, 0.80-0.87x of `cp -r` + fsync; all at the end, 1.04x (docs/PERFORMANCE.md,
// "Sharded directories").
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "grouplin/file.hpp"
#include "io/checkpoints/commit_calls.hpp"

namespace grouplin::detail {

// `p` without a trailing '/': "out/" names the directory "out" (whose temporary sibling goes
// beside it, not into it); the root stays the root. Nothing else is normalized.
std::filesystem::path without_trailing_separator(const std::filesystem::path& p);

class AtomicDirectory {
 public:
  // Creates an empty temporary directory in the folder that will hold `path`. Throws
  // Error(IoError) naming `path` when it cannot.
  static std::unique_ptr<AtomicDirectory> create(const std::string& path);
  // Removes the temporary directory with everything in it unless committed.
  ~AtomicDirectory();
  AtomicDirectory(const AtomicDirectory&) = delete;
  AtomicDirectory& operator=(const AtomicDirectory&) = delete;

  const std::string& temp_path() const { return temp_; }
  // temp_path() / relative, creating the folders `relative` names.
  std::string file(const std::string& relative) const;
  // Commit steps for AtomicFiles inside the directory: their flush only starts the write-back
  // (sync_file_range), and their folder is not flushed; commit() below makes both durable.
  CommitCalls& deferred_flush() { return deferred_; }

  // Flushes every file and folder in the temporary directory (fsync) and moves it to `path`: a
  // rename when nothing is there; when `replace`, an atomic exchange with what is there (a
  // directory or a file), which is removed afterwards. The rename is the commit point. Throws
  // Error(IoError) naming `path` up to the rename (`path` is then untouched), never after it.
  void commit(bool replace);

 private:
  AtomicDirectory(std::string path, std::string temp);
  class DeferredFlush : public CommitCalls {
   public:
    int flush(int fd) override;
    int flush_folder(const std::string& folder) noexcept override;
  };

  std::string path_;
  std::string temp_;
  DeferredFlush deferred_;
  bool committed_ = false;
};

}  // namespace grouplin::detail
