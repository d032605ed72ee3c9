// Private: an input checkpoint opened for streaming, shared by convert, compare and inspect: a
// file, or a directory of shards (grouplin/sharded_checkpoint.hpp) seen as one state dict.
//
//   auto src = grouplin::detail::CheckpointSource::open("model-dir");   // or "in.safetensors"
//   for (const auto& [name, t] : src->tensors()) src->read(t, 0, buffer);  // pread, any shard
//
// Each file is validated by its format's one reader (parse_safetensors_layout, parse_pt) over a
// read-only mapping of the same open file the descriptor refers to; a directory's index is then
// checked against what the shards hold (check_shard_contents), whose warnings it keeps. Nothing but
// the headers (and what the .pt reader must copy: non-contiguous or misaligned tensors) is read at
// open time. A directory keeps one descriptor and one mapping per shard open.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "grouplin/checkpoint.hpp"
#include "grouplin/file.hpp"
#include "grouplin/pt_file.hpp"
#include "grouplin/state_dict.hpp"
#include "io/checkpoints/checkpoint_dir.hpp"
#include "io/formats/safetensors_header.hpp"
#include "layout/planned_reader.hpp"

namespace grouplin::detail {

// Whether `a` sorts before `b` with runs of digits compared as numbers ("layers.2." before
// "layers.10.", "w9" before "w10"), everything else byte by byte: the order of a directory's
// tensors, which then depends on their names alone, not on how they were sharded.
bool natural_less(std::string_view a, std::string_view b);

class CheckpointSource : public layout::PieceSource {
 public:
  // One open input file.
  struct File {
    std::string path;
    int fd = -1;
    uint64_t size = 0;
    dev_t device = 0;  // identity of the open file, to recognise it under another name
    ino_t inode = 0;
    std::shared_ptr<MappedFile> mapping;
    // The storage of the whole mapping: the root (Storage::root) of every tensor the readers made
    // as a view of this file, whose root_offset is then its place in the file.
    std::shared_ptr<Storage> bytes;
  };

  // Opens, maps and validates `path`: a file (format detected by content) or a checkpoint
  // directory (every shard of one format). Safetensors tensors are views of the mappings even
  // when misaligned (callers read bytes, never typed elements, in place), unless
  // `aligned_views`, which copies those few (as load_safetensors does). `map_mode` CopyOnWrite
  // makes the views writable without a write ever reaching the files (MapMode).
  // Throws Error(IoError) for a path that cannot be opened or is neither a regular file nor a
  // directory, Error(UnknownFormat), the readers' errors (messages name the file) and the
  // directory's (read_checkpoint_dir, check_shard_contents).
  static std::unique_ptr<CheckpointSource> open(const std::string& path,
                                                const PtReadOptions& pt_options = {},
                                                bool aligned_views = false,
                                                MapMode map_mode = MapMode::ReadOnly);
  ~CheckpointSource();
  CheckpointSource(const CheckpointSource&) = delete;
  CheckpointSource& operator=(const CheckpointSource&) = delete;

  const std::string& path() const { return path_; }
  CheckpointFormat format() const { return format_; }
  // A file's tensors in file order; a directory's in natural key order (natural_less).
  const StateDict& tensors() const { return tensors_; }
  // A file's "__metadata__"; for a directory, the entries every shard has with the same value.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The grouped modules the metadata declares (grouplin::declared_modules; the error names the
  // path).
  std::vector<std::string> declared_modules() const;
  // The directory's listing and index; nullptr for a single file.
  const CheckpointDir* directory() const { return dir_ ? &*dir_ : nullptr; }
  // What the input gets wrong, or the reader leaves out on purpose, without stopping a reader:
  // check_shard_contents' warnings for a directory, the .pt reader's notes (CopyDropped).
  const std::vector<Problem>& warnings() const { return warnings_; }
  // config.json's model_type for a directory; for a file (or a directory whose config.json names
  // none), the one GroupLin's convert recorded in its safetensors metadata (kModelTypeKey); "".
  std::string model_type() const;
  // The open files: one, or the directory's shards in dir->shards order.
  const std::vector<File>& files() const { return files_; }
  // Bytes of all the files.
  uint64_t file_bytes() const;
  // Whether one of the files is the file with this identity.
  bool holds_file(dev_t device, ino_t inode) const;

  // The file holding `t` and the offset of its first byte there, when its bytes are in a file
  // (a view the readers made of the file's storage: its Storage::root and root offset say so);
  // nullopt when they are in memory a reader allocated.
  std::optional<std::pair<const File*, uint64_t>> locate(const Tensor& t) const;

  // Copies bytes [at, at + dst.size()) of `t` into `dst`: pread from its file (never through the
  // mapping, so a file truncated meanwhile cannot raise SIGBUS), or memcpy from memory.
  // Throws Error(IoError) on a read error, Error(Truncated) if the file ends early (it shrank
  // since open()); both name the file, the input tensor and its byte range, and the byte where
  // reading stopped. Requires: at + dst.size() <= t.nbytes().
  void read(const Tensor& t, uint64_t at, std::span<std::byte> dst) const override;

 private:
  CheckpointSource() = default;
  // What one file holds.
  struct FileContents {
    CheckpointFormat format = CheckpointFormat::Safetensors;
    StateDict tensors;
    std::map<std::string, std::string> metadata;
    std::vector<Problem> notes;  // a .pt file's PtReadOptions::notes
  };
  // Opens, maps and validates the file at `path`, adding it to files_.
  FileContents open_file(const std::string& path, const PtReadOptions& pt_options,
                         bool aligned_views, MapMode map_mode);
  // `tensor "<name>" lies at bytes [b, e) of the file`: the input tensor holding byte `pos` of
  // `file`, for error messages (`piece`'s own range if no tensor holds it).
  std::string describe_range(const File& file, const Tensor& piece, uint64_t pos) const;

  std::string path_;
  CheckpointFormat format_ = CheckpointFormat::Safetensors;
  StateDict tensors_;
  std::map<std::string, std::string> metadata_;
  std::optional<CheckpointDir> dir_;
  std::vector<Problem> warnings_;
  std::vector<File> files_;
};

}  // namespace grouplin::detail
