// Format detection and dispatch between the safetensors and .pt loaders and savers.
#include "grouplin/checkpoint.hpp"

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
  unsigned char head[9] = {};
  in.read(reinterpret_cast<char*>(head), sizeof head);
  const auto got = static_cast<size_t>(in.gcount());
  if (got >= 4 && head[0] == 'P' && head[1] == 'K' && head[2] == 3 && head[3] == 4) {
    return CheckpointFormat::Pt;
  }
  if (got == 9) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | head[i];
    if (n >= 2 && n <= kSafetensorsMaxHeaderSize && n <= size - 8 && head[8] == '{') {
      return CheckpointFormat::Safetensors;
    }
  }
  throw Error(ErrorCode::UnknownFormat,
              "reading " + quote(path) +
                  ": neither a PyTorch zip archive nor a safetensors file (first bytes: " +
                  first_bytes_hex(head, got) + ")");
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
