// Opening an input checkpoint, a file or a directory of shards, for streaming (see
// io/checkpoint_source.hpp).
#include "io/checkpoints/checkpoint_source.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "grouplin/checkpoint_layout.hpp"
#include "grouplin/error.hpp"
#include "grouplin/safetensors.hpp"

namespace grouplin::detail {

bool natural_less(std::string_view a, std::string_view b) {
  size_t i = 0, j = 0;
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  while (i < a.size() && j < b.size()) {
    if (digit(a[i]) && digit(b[j])) {
      // Compare the numbers: without leading zeros, the shorter is smaller, then digit by digit.
      size_t ai = i, bj = j;
      while (ai < a.size() && a[ai] == '0') ++ai;
      while (bj < b.size() && b[bj] == '0') ++bj;
      size_t ae = ai, be = bj;
      while (ae < a.size() && digit(a[ae])) ++ae;
      while (be < b.size() && digit(b[be])) ++be;
      if (ae - ai != be - bj) return ae - ai < be - bj;
      const int c = a.substr(ai, ae - ai).compare(b.substr(bj, be - bj));
      if (c != 0) return c < 0;
      if (ae - i != be - j) return ae - i < be - j;  // "01" after "1": equal values, fewer zeros
      i = ae;
      j = be;
      continue;
    }
    if (a[i] != b[j]) return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[j]);
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}

std::unique_ptr<CheckpointSource> CheckpointSource::open(const std::string& path,
                                                         const PtReadOptions& pt_options,
                                                         bool aligned_views, MapMode map_mode) {
  std::unique_ptr<CheckpointSource> src(new CheckpointSource());
  src->path_ = path;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    throw Error(ErrorCode::IoError, "opening " + quote(path) + ": " + std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode)) {
    FileContents c = src->open_file(path, pt_options, aligned_views, map_mode);
    src->format_ = c.format;
    src->tensors_ = std::move(c.tensors);
    src->metadata_ = std::move(c.metadata);
    src->warnings_ = std::move(c.notes);
    return src;
  }

  src->dir_ = read_checkpoint_dir(path);
  const CheckpointDir& dir = *src->dir_;
  std::vector<FileContents> shards;
  std::vector<ShardTensors> contents;
  for (size_t k = 0; k < dir.shards.size(); ++k) {
    shards.push_back(src->open_file(dir.file(dir.shards[k]), pt_options, aligned_views, map_mode));
    if (shards[k].format != shards[0].format) {
      throw Error(ErrorCode::UnknownFormat, "reading the checkpoint directory " + quote(path) +
                                                ": the shard " + quote(dir.shards[k]) + " is a " +
                                                std::string(format_name(shards[k].format)) +
                                                " file, " + quote(dir.shards[0]) + " a " +
                                                std::string(format_name(shards[0].format)) +
                                                " file; expected shards of one format");
    }
    ShardTensors& names = contents.emplace_back();
    for (const auto& [name, t] : shards[k].tensors) names.emplace_back(name, t.nbytes());
  }
  // Checked before the shards' tensors join one dict, so that a tensor in two shards is
  // reported as such.
  src->warnings_ = check_shard_contents(dir, contents);
  for (FileContents& shard : shards) {
    for (Problem& n : shard.notes) src->warnings_.push_back(std::move(n));
  }
  // In natural key order, whatever shard holds what: the order a conversion writes then depends
  // on the names alone, so that converting GroupLin's output back and forth gives the same files.
  std::vector<const StateDict::Entry*> entries;
  for (const FileContents& shard : shards) {
    for (const StateDict::Entry& e : shard.tensors) entries.push_back(&e);
  }
  std::sort(entries.begin(), entries.end(),
            [](const StateDict::Entry* a, const StateDict::Entry* b) {
              return natural_less(a->first, b->first);
            });
  for (const StateDict::Entry* e : entries) src->tensors_.insert(e->first, e->second);
  if (!shards.empty()) {
    src->format_ = shards[0].format;
    // Metadata every shard agrees on ("format": "pt" in Hugging Face's shards).
    for (const auto& [key, value] : shards[0].metadata) {
      bool shared = true;
      for (const FileContents& shard : shards) {
        auto it = shard.metadata.find(key);
        shared = shared && it != shard.metadata.end() && it->second == value;
      }
      if (shared) src->metadata_.emplace(key, value);
    }
  }
  return src;
}

CheckpointSource::FileContents CheckpointSource::open_file(const std::string& path,
                                                           const PtReadOptions& pt_options,
                                                           bool aligned_views, MapMode map_mode) {
  File f;
  f.path = path;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) {
    throw Error(ErrorCode::IoError, "opening " + quote(path) + ": " + std::strerror(errno));
  }
  files_.push_back(f);  // closed by the destructor from here on, whatever happens next
  File& file = files_.back();
  struct stat st;
  if (::fstat(file.fd, &st) != 0) {
    throw Error(ErrorCode::IoError,
                "reading the size of " + quote(path) + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    throw Error(ErrorCode::IoError, "opening " + quote(path) + ": not a regular file");
  }
  file.size = static_cast<uint64_t>(st.st_size);
  file.device = st.st_dev;
  file.inode = st.st_ino;

  // Map the very file the descriptor holds (not whatever the name points to by now).
  const std::string self = "/proc/self/fd/" + std::to_string(file.fd);
  try {
    file.mapping = MappedFile::open(::access(self.c_str(), R_OK) == 0 ? self : path, map_mode);
  } catch (const Error& e) {
    throw Error(e.code(), "mapping " + quote(path) + ": " + e.message());
  }
  FileContents c;
  c.format = detect_format(path);
  file.bytes = file.mapping->storage(0, file.mapping->size());
  const std::shared_ptr<Storage>& bytes = file.bytes;
  if (c.format == CheckpointFormat::Pt) {
    PtReadOptions with_notes = pt_options;
    with_notes.notes = &c.notes;
    c.tensors = parse_pt(bytes, path, with_notes);
  } else if (aligned_views) {
    SafetensorsFile parsed = parse_safetensors(bytes, path);
    c.tensors = std::move(parsed.tensors);
    c.metadata = std::move(parsed.metadata);
  } else {
    SafetensorsLayout layout = parse_safetensors_layout({bytes->data(), bytes->size()}, path);
    c.metadata = std::move(layout.header.metadata);
    for (SafetensorsEntry& e : layout.header.entries) {
      c.tensors.insert(std::move(e.name),
                       Tensor::view_of(bytes, layout.data_offset + e.begin, e.shape, e.dtype));
    }
  }
  return c;
}

CheckpointSource::~CheckpointSource() {
  for (const File& f : files_) ::close(f.fd);
}

std::string CheckpointSource::model_type() const {
  if (dir_ && !dir_->model_type.empty()) return dir_->model_type;
  auto it = metadata_.find(kModelTypeKey);
  return it == metadata_.end() ? "" : it->second;
}

std::vector<std::string> CheckpointSource::declared_modules() const {
  return grouplin::declared_modules(metadata_, quote(path_));
}

uint64_t CheckpointSource::file_bytes() const {
  uint64_t n = 0;
  for (const File& f : files_) n += f.size;
  return n;
}

bool CheckpointSource::holds_file(dev_t device, ino_t inode) const {
  for (const File& f : files_) {
    if (f.device == device && f.inode == inode) return true;
  }
  return false;
}

std::optional<std::pair<const CheckpointSource::File*, uint64_t>> CheckpointSource::locate(
    const Tensor& t) const {
  if (!t.storage()) return std::nullopt;
  const Storage* root = t.storage()->root();
  for (const File& f : files_) {
    if (f.bytes.get() == root) {
      return std::make_pair(&f,
                            static_cast<uint64_t>(t.storage()->root_offset() + t.storage_offset()));
    }
  }
  return std::nullopt;
}

std::string CheckpointSource::describe_range(const File& file, const Tensor& piece,
                                             uint64_t pos) const {
  // The input tensor holding byte `pos` (a piece may be one expert's slice of a stacked tensor).
  for (const auto& [name, t] : tensors_) {
    const auto where = locate(t);
    if (where && where->first == &file && pos >= where->second &&
        pos - where->second < t.nbytes()) {
      return "tensor " + quote(name) + " lies at bytes [" + std::to_string(where->second) + ", " +
             std::to_string(where->second + t.nbytes()) + ") of the file";
    }
  }
  const uint64_t begin = locate(piece).value_or(std::make_pair(&file, uint64_t{0})).second;
  return "tensor bytes [" + std::to_string(begin) + ", " + std::to_string(begin + piece.nbytes()) +
         ") of the file";
}

void CheckpointSource::read(const Tensor& t, uint64_t at, std::span<std::byte> dst) const {
  const auto where = locate(t);
  if (!where) {
    if (!dst.empty()) std::memcpy(dst.data(), t.data() + at, dst.size());
    return;
  }
  const File& file = *where->first;
  // pread, never the mapping: bytes past a new end of the file (another program truncated it)
  // are a short read here, where touching them through the mapping would raise SIGBUS.
  uint64_t pos = where->second + at;
  std::byte* p = dst.data();
  size_t left = dst.size();
  while (left > 0) {
    ssize_t n = ::pread(file.fd, p, left, static_cast<off_t>(pos));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      throw Error(ErrorCode::IoError, "reading " + quote(file.path) + ": " +
                                          describe_range(file, t, pos) + "; reading byte " +
                                          std::to_string(pos) + ": " + std::strerror(err));
    }
    if (n == 0) {
      struct stat st;
      const std::string now = ::fstat(file.fd, &st) == 0
                                  ? "it now has " + std::to_string(st.st_size)
                                  : "its size cannot be read now, it had";
      throw Error(ErrorCode::Truncated, "reading " + quote(file.path) + ": " +
                                            describe_range(file, t, pos) +
                                            ", but the file ended at byte " + std::to_string(pos) +
                                            ": " + now + " bytes, " + std::to_string(file.size) +
                                            " when opened (was it changed while being read?)");
    }
    p += n;
    left -= static_cast<size_t>(n);
    pos += static_cast<uint64_t>(n);
  }
}

}  // namespace grouplin::detail
