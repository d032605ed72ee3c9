// Format detection and dispatch between the safetensors and .pt loaders and savers.
#include "grouplin/checkpoint.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "grouplin/error.hpp"
#include "grouplin/pt_file.hpp"
#include "grouplin/safetensors.hpp"
#include "io/checkpoints/checkpoint_source.hpp"

namespace grouplin {
namespace {

std::string first_bytes_hex(const unsigned char* b, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    char buf[4];
    std::snprintf(buf, sizeof buf, "%02x", b[i]);
    if (i) s += ' ';
    s += buf;
  }
  return s.empty() ? "none, the file is empty" : s;
}

// Files people mistake for checkpoints GroupLin reads, by their first bytes: named in the error.
struct KnownFile {
  std::string_view magic;
  const char* what;
};
constexpr KnownFile kKnownFiles[] = {
    // torch.save before PyTorch 1.6 (or _use_new_zipfile_serialization=False): PROTO 2, then the
    // LONG1 magic number 0x1950a86a20f9469cfc6c.
    {std::string_view("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9", 9),
     "a PyTorch file in torch.save's legacy format (PyTorch before 1.6, or "
     "_use_new_zipfile_serialization=False), which GroupLin does not read; save it again with "
     "PyTorch 1.6 or later (torch.save(torch.load(path, weights_only=True), new_path))"},
    {"GGUF", "a GGUF file (llama.cpp's format), which GroupLin does not read"},
    {"\x93NUMPY", "a NumPy .npy array, not a checkpoint of named tensors"},
    {"\x89HDF\r\n\x1a\n", "an HDF5 file (Keras .h5), which GroupLin does not read"},
    {"\x1f\x8b", "a gzip-compressed file; decompress it first"},
    {"version https://git-lfs",
     "a Git LFS pointer, not the file's content; fetch it (git lfs pull)"},
};

}  // namespace

std::string_view format_name(CheckpointFormat format) {
  return format == CheckpointFormat::Pt ? "pt" : "safetensors";
}

CheckpointFormat detect_format(const std::string& path) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  std::ifstream in(path, std::ios::binary);
  if (ec || !in) {
    throw Error(ErrorCode::IoError, "reading " + quote(path) + ": " +
                                        (ec ? ec.message() : std::string("cannot open the file")));
  }
  unsigned char head[24] = {};
  in.read(reinterpret_cast<char*>(head), sizeof head);
  const auto got = static_cast<size_t>(in.gcount());
  const std::string_view start(reinterpret_cast<const char*>(head), got);
  if (got >= 4 && head[0] == 'P' && head[1] == 'K' && head[2] == 3 && head[3] == 4) {
    return CheckpointFormat::Pt;
  }
  if (got >= 8) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | head[i];
    const bool header_start = got == 8 || head[8] == '{';
    if (n >= 2 && n <= kSafetensorsMaxHeaderSize && header_start) {
      if (n <= size - 8 && got > 8) return CheckpointFormat::Safetensors;
      throw Error(ErrorCode::Truncated,
                  "reading " + quote(path) + ": a safetensors file whose header of " +
                      std::to_string(n) + " bytes ends past the end of the file (" +
                      std::to_string(size) +
                      " bytes): it was cut short (an interrupted download or copy?)");
    }
  }
  for (const KnownFile& k : kKnownFiles) {
    if (start.substr(0, k.magic.size()) == k.magic) {
      throw Error(ErrorCode::UnknownFormat, "reading " + quote(path) + ": " + k.what);
    }
  }
  throw Error(ErrorCode::UnknownFormat,
              "reading " + quote(path) +
                  ": neither a PyTorch zip archive nor a safetensors file (first bytes: " +
                  first_bytes_hex(head, std::min<size_t>(got, 9)) + ")");
}

std::optional<CheckpointFormat> format_for_extension(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (ext == ".safetensors") return CheckpointFormat::Safetensors;
  if (ext == ".pt" || ext == ".pth" || ext == ".bin") return CheckpointFormat::Pt;
  return std::nullopt;
}

Checkpoint load_checkpoint(const std::string& path, MapMode mode) {
  Checkpoint c;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    // Every shard mapped, typed views (misaligned tensors copied, as load_safetensors does).
    std::unique_ptr<detail::CheckpointSource> src =
        detail::CheckpointSource::open(path, {}, /*aligned_views=*/true, mode);
    c.tensors = src->tensors();
    c.metadata = src->metadata();
    c.format = src->format();
    c.model_type = src->model_type();
    c.shards = src->directory()->shards;
    c.warnings = src->warnings();
    return c;
  }
  c.format = detect_format(path);
  if (c.format == CheckpointFormat::Pt) {
    c.tensors = load_pt(path, {}, mode);
  } else {
    SafetensorsFile f = load_safetensors(path, mode);
    c.tensors = std::move(f.tensors);
    c.metadata = std::move(f.metadata);
  }
  return c;
}

void save_checkpoint(const std::string& path, const StateDict& tensors,
                     std::optional<CheckpointFormat> format,
                     const std::map<std::string, std::string>& metadata) {
  const CheckpointFormat f =
      format.value_or(format_for_extension(path).value_or(CheckpointFormat::Safetensors));
  if (f == CheckpointFormat::Pt) {
    save_pt(path, tensors);
  } else {
    save_safetensors(path, tensors, metadata);
  }
}

}  // namespace grouplin
