// Private: the safetensors header as data, for the readers and writers that stream tensor bytes
// themselves (convert, the checkpoint source): the validator every input goes through
// (grouplin/safetensors.hpp lists its checks and codes), where a validated file keeps its tensors,
// and the header and data order a writer produces.
//
//   SafetensorsLayout l = parse_safetensors_layout(bytes, "in.safetensors");
//   for (const SafetensorsEntry& e : l.header.entries) ... l.data_offset + e.begin ...
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "grouplin/safetensors.hpp"

namespace grouplin {

// Throws Error(HeaderTooLarge) when a header length `n` passes kSafetensorsMaxHeaderSize;
// `context` starts the message ("loading \"x.safetensors\"").
void check_safetensors_header_length(uint64_t n, const std::string& context);

// One tensor as its header entry describes it.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0;  // byte offsets into the data buffer, end exclusive
  uint64_t end = 0;
};

// A validated header.
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // sorted by offsets (ties keep header order)
  std::map<std::string, std::string> metadata;
};

// Validates `json` (the N header bytes, padding included) against a data buffer of `data_size`
// bytes: every check above from "caps" on. `context` starts each error message
// ("loading \"x.safetensors\""). Returns the entries; allocates only in proportion to
// json.size(). Throws Error with the codes listed above.
SafetensorsHeader parse_safetensors_header(std::string_view json, uint64_t data_size,
                                           const std::string& context);

// Where a validated file keeps its tensors: the header, and the file offset of the data buffer
// (8 + N), so that tensor e occupies file bytes [data_offset + e.begin, data_offset + e.end).
struct SafetensorsLayout {
  SafetensorsHeader header;
  uint64_t data_offset = 0;
};

// Every check of parse_safetensors on the whole file in `file` (size, caps, bounds, then
// parse_safetensors_header), without making tensors: nothing is copied and only the header bytes
// are read, so a caller can stream the data itself. `name_for_errors` as in parse_safetensors.
// Throws Error with the codes listed above.
SafetensorsLayout parse_safetensors_layout(std::span<const std::byte> file,
                                           const std::string& name_for_errors);

// What write_safetensors writes before the tensor data, for tensors of these names, dtypes and
// shapes (the offsets of `entries` are ignored).
struct SafetensorsWritePlan {
  std::string header;                     // the JSON, padded with spaces to a multiple of 8
  std::vector<SafetensorsEntry> entries;  // in data order, with their offsets
  std::vector<size_t> order;              // entries[k] is the input entry order[k]
  uint64_t data_size = 0;                 // bytes of the data buffer
};

// The header and data order write_safetensors uses (same sort, same bytes), already run through
// parse_safetensors_header, for writers that stream tensor data from elsewhere. `context` starts
// error messages. Throws Error(InvalidArgument) for a name that is not UTF-8 or is
// "__metadata__", Error(InvalidMetadata), Error(SizeOverflow), Error(HeaderTooLarge), and the
// validator's codes.
SafetensorsWritePlan plan_safetensors_write(std::vector<SafetensorsEntry> entries,
                                            const std::map<std::string, std::string>& metadata,
                                            const std::string& context);

}  // namespace grouplin
