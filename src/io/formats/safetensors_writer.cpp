// Writes safetensors files as the reference implementation does, byte for byte, straight from
// each tensor's storage; the header it builds goes through the reader's validator first.
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/utf8.hpp"
#include "grouplin/error.hpp"
#include "grouplin/safetensors.hpp"
#include "io/formats/safetensors_header.hpp"

namespace grouplin {
namespace {

// The reference sorts tensors by its Dtype enum, descending, then by name. That enum lists the
// dtypes in increasing alignment, so larger elements come first and every tensor's data stays
// aligned to its element size; within one size the enum order decides.
int reference_rank(DType t) {
  switch (t) {
    case DType::BOOL:
      return 0;
    case DType::U8:
      return 1;
    case DType::I8:
      return 2;
    case DType::F8_E5M2:
      return 3;
    case DType::F8_E4M3:
      return 4;
    case DType::F8_E8M0:
      return 5;
    case DType::I16:
      return 6;
    case DType::U16:
      return 7;
    case DType::F16:
      return 8;
    case DType::BF16:
      return 9;
    case DType::I32:
      return 10;
    case DType::U32:
      return 11;
    case DType::F32:
      return 12;
    case DType::F64:
      return 13;
    case DType::I64:
      return 14;
    case DType::U64:
      return 15;
  }
  return -1;
}

// Appends `s` as a JSON string the way serde_json writes it: '"' and '\' escaped, \b \f \n \r \t
// short, other control characters as \u00xx, everything else (UTF-8 included) as is.
// Requires: s is valid UTF-8.
void append_json_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (char c : s) {
    auto b = static_cast<uint8_t>(c);
    switch (b) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (b < 0x20) {
          out += "\\u00";
          out += kHex[b >> 4];
          out += kHex[b & 15];
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void write_u64_le(FileSink& sink, uint64_t v) {
  std::byte bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<std::byte>((v >> (8 * i)) & 0xFF);
  sink.write(bytes);
}

void write_file(FileSink& sink, const StateDict& tensors,
                const std::map<std::string, std::string>& metadata, const std::string& context) {
  std::vector<SafetensorsEntry> entries;
  std::vector<const Tensor*> items;
  entries.reserve(tensors.size());
  items.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    if (!tensor.defined()) {
      throw Error(ErrorCode::UndefinedTensor,
                  context + ": tensor " + quote(name) + " is undefined");
    }
    entries.push_back({name, tensor.dtype(), tensor.shape(), 0, 0});
    items.push_back(&tensor);
  }
  const SafetensorsWritePlan plan = plan_safetensors_write(std::move(entries), metadata, context);

  write_u64_le(sink, plan.header.size());
  sink.write(std::as_bytes(std::span(plan.header.data(), plan.header.size())));
  for (size_t i : plan.order) {
    const Tensor& t = *items[i];
    if (t.nbytes() != 0) sink.write(std::span(t.data(), t.nbytes()));
  }
}

}  // namespace

SafetensorsWritePlan plan_safetensors_write(std::vector<SafetensorsEntry> entries,
                                            const std::map<std::string, std::string>& metadata,
                                            const std::string& context) {
  // Check the input, then order it as the reference does.
  for (const SafetensorsEntry& e : entries) {
    if (e.name == "__metadata__") {
      throw Error(ErrorCode::InvalidArgument,
                  context + ": a tensor cannot be named \"__metadata__\" (reserved for metadata)");
    }
    if (!utf8::is_valid(e.name)) {
      throw Error(ErrorCode::InvalidArgument,
                  context + ": tensor name " + quote(e.name) + " is not valid UTF-8");
    }
  }
  for (const auto& [key, value] : metadata) {
    if (!utf8::is_valid(key) || !utf8::is_valid(value)) {
      throw Error(ErrorCode::InvalidMetadata, context + ": metadata entry " + quote(key) + " = " +
                                                  quote(value) + " is not valid UTF-8");
    }
  }
  SafetensorsWritePlan plan;
  plan.order.resize(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) plan.order[i] = i;
  std::sort(plan.order.begin(), plan.order.end(), [&](size_t a, size_t b) {
    int ra = reference_rank(entries[a].dtype), rb = reference_rank(entries[b].dtype);
    if (ra != rb) return ra > rb;
    return entries[a].name < entries[b].name;  // bytewise, as Rust compares strings
  });

  // The header, compact JSON as serde_json writes it.
  std::string& header = plan.header;
  header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!first) header += ',';
      first = false;
      append_json_string(header, key);
      header += ':';
      append_json_string(header, value);
    }
    header += '}';
  }
  uint64_t offset = 0;
  plan.entries.reserve(entries.size());
  for (size_t i : plan.order) {
    SafetensorsEntry& e = entries[i];
    // The numel fits in int64_t for a Shape a Tensor holds; check anyway, entries may come from
    // anywhere.
    uint64_t nbytes = static_cast<uint64_t>(shape_numel(e.shape));
    if (nbytes > UINT64_MAX / dtype_size(e.dtype)) {
      throw Error(ErrorCode::SizeOverflow,
                  context + ": tensor " + quote(e.name) + " holds more than 2^64 bytes");
    }
    nbytes *= dtype_size(e.dtype);
    if (nbytes > UINT64_MAX - offset) {
      throw Error(ErrorCode::SizeOverflow, context + ": tensors hold more than 2^64 bytes");
    }
    if (header.size() > 1) header += ',';
    append_json_string(header, e.name);
    header += ":{\"dtype\":\"";
    header += dtype_name(e.dtype);
    header += "\",\"shape\":[";
    for (size_t d = 0; d < e.shape.size(); ++d) {
      if (d) header += ',';
      header += std::to_string(e.shape[d]);
    }
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + nbytes) + "]}";
    e.begin = offset;
    e.end = offset + nbytes;
    offset += nbytes;
    plan.entries.push_back(std::move(e));
  }
  header += '}';
  header.append((8 - header.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  plan.data_size = offset;

  // What we are about to write must pass the reader's own checks.
  parse_safetensors_header(header, offset, context);
  return plan;
}

void write_safetensors(FileSink& sink, const StateDict& tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_file(sink, tensors, metadata, "writing safetensors");
}

void save_safetensors(const std::string& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::unique_ptr<AtomicFile> file = AtomicFile::create(path);
  write_file(*file, tensors, metadata, "saving " + quote(path));
  // A failure to flush the folder after the rename is not reported (folder_flush_error()): the
  // file is whole and in place, and the OS writes the folder entry back on its own.
  file->commit();
}

}  // namespace grouplin
