// Loading safetensors files on the one header validator (safetensors_header.cpp): the size and
// bounds of the header, then zero-copy tensors viewing the mapped file.
#include <cstdint>
#include <string>

#include "grouplin/error.hpp"
#include "grouplin/safetensors.hpp"
#include "io/formats/safetensors_header.hpp"

namespace grouplin {
namespace {

uint64_t load_le64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

}  // namespace

SafetensorsLayout parse_safetensors_layout(std::span<const std::byte> file,
                                           const std::string& name_for_errors) {
  std::string context = "loading " + quote(name_for_errors);

  // size → caps → bounds, then the header validator does the rest.
  size_t size = file.size();
  if (size < 8) {
    throw Error(ErrorCode::FileTooSmall, context + ": the file has " + std::to_string(size) +
                                             " bytes, fewer than the 8 of the header length");
  }
  uint64_t n = load_le64(file.data());
  check_safetensors_header_length(n, context);
  if (n > size - 8) {
    throw Error(ErrorCode::HeaderPastEnd, context + ": the header length " + std::to_string(n) +
                                              " runs past the end of the file (" +
                                              std::to_string(size - 8) +
                                              " bytes follow the length)");
  }
  std::string_view json(reinterpret_cast<const char*>(file.data()) + 8, n);
  size_t data_offset = 8 + n;
  return {parse_safetensors_header(json, size - data_offset, context), data_offset};
}

SafetensorsFile parse_safetensors(std::shared_ptr<Storage> bytes,
                                  const std::string& name_for_errors) {
  if (!bytes) {
    throw Error(ErrorCode::InvalidArgument,
                "loading " + quote(name_for_errors) + ": no storage given");
  }
  SafetensorsLayout layout =
      parse_safetensors_layout({bytes->data(), bytes->size()}, name_for_errors);

  SafetensorsFile file;
  file.metadata = std::move(layout.header.metadata);
  for (SafetensorsEntry& e : layout.header.entries) {
    Tensor t = Tensor::view_of(bytes, layout.data_offset + e.begin, e.shape, e.dtype);
    // Kernels read elements through typed pointers: give them aligned ones.
    if (reinterpret_cast<uintptr_t>(t.data()) % dtype_size(e.dtype) != 0) t = t.clone();
    file.tensors.insert(std::move(e.name), std::move(t));
  }
  return file;
}

SafetensorsFile load_safetensors(const std::string& path, MapMode mode) {
  std::shared_ptr<MappedFile> mapped = MappedFile::open(path, mode);
  SafetensorsFile file = parse_safetensors(mapped->storage(0, mapped->size()), path);
  // Valid, so the header length is in bounds. Start reading the tensors in the background.
  size_t data_offset = 8 + load_le64(mapped->data());
  mapped->will_need(data_offset, mapped->size() - data_offset);
  return file;
}

}  // namespace grouplin
