// Private: a directory built beside its final place and renamed into it, so that readers see the
// old directory or the whole new one, never a part (convert's sharded output).
//
//   auto dir = grouplin::detail::AtomicDirectory::create("out-model");  // .out-model.tmp.<pid>.<n>
//   write_into(dir->file("model-00001-of-00002.safetensors"));           // any files, any order
//   dir->commit(/*replace=*/false);  // fsync the folder, rename it to "out-model"
//   // destroyed without commit(): the temporary directory and all it holds are removed
#pragma once

#include <memory>
#include <string>

namespace grouplin::detail {

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

  // Flushes the temporary directory and moves it to `path`: a rename when nothing is there; when
  // `replace`, an atomic exchange with what is there (a directory or a file), which is removed
  // afterwards. The rename is the commit point. Throws Error(IoError) naming `path` up to the
  // rename (`path` is then untouched), never after it.
  void commit(bool replace);

 private:
  AtomicDirectory(std::string path, std::string temp);
  std::string path_;
  std::string temp_;
  bool committed_ = false;
};

}  // namespace grouplin::detail
