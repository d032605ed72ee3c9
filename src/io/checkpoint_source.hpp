// Private: an input checkpoint opened for streaming, shared by convert and compare.
//
//   auto src = grouplin::detail::CheckpointSource::open("in.safetensors");
//   for (const auto& [name, t] : src->tensors()) {
//     if (auto off = src->file_offset(t)) copy_file_range(src->fd(), *off, ...);
//     else src->read(t, 0, buffer);   // bytes the reader copied to memory
//   }
//
// The file is validated by the format's one reader (parse_safetensors_layout, parse_pt) over a
// read-only mapping of the same open file the descriptor refers to; nothing but the headers (and
// what the .pt reader must copy: non-contiguous or misaligned tensors) is read at open time.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "grouplin/checkpoint.hpp"
#include "grouplin/file.hpp"
#include "grouplin/pt_file.hpp"
#include "grouplin/state_dict.hpp"

namespace grouplin::detail {

class CheckpointSource {
 public:
  // Opens, maps and validates `path` (format detected by content). Safetensors tensors are views
  // of the mapping even when misaligned (callers read bytes, never typed elements, in place).
  // Throws Error(IoError) for a file that cannot be opened or is not a regular file,
  // Error(UnknownFormat), and the reader's errors (messages name the file).
  static std::unique_ptr<CheckpointSource> open(const std::string& path,
                                                const PtReadOptions& pt_options = {});
  ~CheckpointSource();
  CheckpointSource(const CheckpointSource&) = delete;
  CheckpointSource& operator=(const CheckpointSource&) = delete;

  const std::string& path() const { return path_; }
  CheckpointFormat format() const { return format_; }
  const StateDict& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  int fd() const { return fd_; }
  uint64_t file_size() const { return size_; }
  // Identity of the open file, to recognise the same file under another name.
  dev_t device() const { return device_; }
  ino_t inode() const { return inode_; }

  // File offset of the first byte of `t` when its bytes are in the file (a view of the mapping);
  // nullopt when they are in memory the reader allocated.
  std::optional<uint64_t> file_offset(const Tensor& t) const;

  // Copies bytes [at, at + dst.size()) of `t` into `dst`: pread from the file (never through the
  // mapping, so a file truncated meanwhile cannot raise SIGBUS), or memcpy from memory.
  // Throws Error(IoError) on a read error, Error(Truncated) if the file ends early (it shrank
  // since open()); both name the file, the input tensor and its byte range, and the byte where
  // reading stopped. Requires: at + dst.size() <= t.nbytes().
  void read(const Tensor& t, uint64_t at, std::span<std::byte> dst) const;

 private:
  CheckpointSource() = default;
  // `tensor "<name>" lies at bytes [b, e) of the file`: the input tensor holding byte `pos` of
  // the file, for error messages (`piece`'s own range if no tensor holds it).
  std::string describe_range(const Tensor& piece, uint64_t pos) const;

  std::string path_;
  CheckpointFormat format_ = CheckpointFormat::Safetensors;
  StateDict tensors_;
  std::map<std::string, std::string> metadata_;
  std::shared_ptr<MappedFile> mapping_;
  int fd_ = -1;
  uint64_t size_ = 0;
  dev_t device_ = 0;
  ino_t inode_ = 0;
};

}  // namespace grouplin::detail
