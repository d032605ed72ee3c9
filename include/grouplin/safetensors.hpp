// safetensors files: validated zero-copy loading, deterministic atomic saving.
//
//   grouplin::SafetensorsFile f = grouplin::load_safetensors("model.safetensors");
//   const grouplin::Tensor& w = f.tensors.at("decoder.fc1.weight0");  // read-only view of the file
//   std::string framework = f.metadata["format"];
//
//   grouplin::StateDict sd;
//   sd.insert("fc1.weight", grouplin::Tensor::zeros({4, 8}, grouplin::DType::BF16));
//   grouplin::save_safetensors("out.safetensors", sd, {{"format", "pt"}});  // atomic
//
// The format: a u64 little-endian header length N, N bytes of UTF-8 JSON, then the data buffer.
// The JSON object maps each tensor name to {"dtype": "F32", "shape": [2, 2], "data_offsets":
// [begin, end]} (byte offsets into the data buffer, end exclusive), plus an optional
// "__metadata__" object of string values.
//
// Every input goes through one validator, in this order, each failure with its own ErrorCode and
// a message naming the file, the tensor and the bad value:
//   size    file shorter than 8 bytes ........................................ FileTooSmall
//   caps    N > kSafetensorsMaxHeaderSize (100,000,000) ....................... HeaderTooLarge
//   bounds  8 + N past the end of the file ..................................... HeaderPastEnd
//   parse   header not UTF-8, not JSON (NUL bytes and a byte-order mark included) . InvalidHeader
//   structure, in header order (the first problem met while reading wins):
//           top level not an object; an entry not an object; a field other than dtype, shape,
//           data_offsets (rejected: an unknown field could change the meaning of the bytes);
//           a missing field; dtype not a string; shape not an array of integers >= 0
//           ................................................................... InvalidHeader
//           two keys with the same name (tensors, metadata keys or fields) ....... DuplicateName
//           "__metadata__" not an object of strings (null is accepted as "none", as the
//           reference does) ................................................... InvalidMetadata
//           dtype string unknown ............................................... UnknownDType
//           dtype valid in safetensors but absent from GroupLin (F8_E8M0, C64, F4, F6_E2M3,
//           F6_E3M2, ...) .................................................... UnsupportedDType
//           data_offsets not two integers >= 0, or begin > end ................ InvalidOffsets
//           a dimension > 2^63-1, or shape x dtype size overflows 64 bits ........ SizeOverflow
//           end - begin != bytes the dtype and shape need .................. TensorSizeMismatch
//   tiling  tensors sorted by offsets must each begin where the previous ended: a gap, an
//           overlap or two tensors aliasing the same bytes ............... OffsetsNotContiguous
//   end     the last end is past the data buffer ..................................... Truncated
//           the last end is before the end of the data buffer .................. TrailingBytes
// Nothing is allocated from a number read in the file before all of this has passed. Zero-size
// and 0-rank tensors are legal; zero-size tensors may share an offset.
//
// The functions below share no state: any of them may run on several threads at once.

#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "grouplin/dtype.hpp"
#include "grouplin/file.hpp"
#include "grouplin/state_dict.hpp"
#include "grouplin/storage.hpp"
#include "grouplin/tensor.hpp"

namespace grouplin {

// Largest header accepted (and written), as in the reference implementation.
inline constexpr uint64_t kSafetensorsMaxHeaderSize = 100'000'000;

// A loaded file: tensors in the order of their data in the file, and the "__metadata__" map.
struct SafetensorsFile {
  StateDict tensors;
  std::map<std::string, std::string> metadata;
};

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

// Validates a whole file held in `bytes` and returns views of it: each tensor shares `bytes`
// (zero-copy; writable only if `bytes` is), except a tensor whose data is not aligned to its
// element size (only files from other writers can have one), which is copied into aligned heap
// memory. `name_for_errors` is the file name that error messages quote.
// Throws Error (codes above); never reads outside `bytes`. Requires: bytes != nullptr.
SafetensorsFile parse_safetensors(std::shared_ptr<Storage> bytes,
                                  const std::string& name_for_errors);

// Maps `path` (read-only, or copy-on-write with `mode`: MapMode) and parses it as
// parse_safetensors does. The tensors are views of the mapping (read-only, or writable without a
// write reaching the file) and keep it alive (the file may be renamed over or deleted meanwhile);
// reading starts in the background (MappedFile::will_need on the data buffer).
// Throws Error(IoError) if the file cannot be opened or mapped, else as parse_safetensors.
SafetensorsFile load_safetensors(const std::string& path, MapMode mode = MapMode::ReadOnly);

// Writes `tensors` and `metadata` in safetensors format to `sink`, byte-identical to what the
// reference implementation writes for the same input when metadata has at most one key:
// "__metadata__" first (if not empty, keys sorted), tensors ordered by dtype alignment
// descending (the reference's dtype rank breaks ties between dtypes of one size) then by name,
// header padded with spaces to a multiple of 8, each tensor's bytes written straight from its
// storage (no copy of the whole file). The header is run through parse_safetensors_header before
// anything is written. Does not call sink.commit().
// Throws Error(UndefinedTensor) for an undefined tensor, Error(InvalidArgument) for a name that is
// not UTF-8 or is "__metadata__", Error(InvalidMetadata) for metadata that is not UTF-8,
// Error(HeaderTooLarge) past the cap, and whatever sink.write throws.
void write_safetensors(FileSink& sink, const StateDict& tensors,
                       const std::map<std::string, std::string>& metadata = {});

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

// write_safetensors to an AtomicFile at `path`, then commit(): on any error, or a crash, the old
// file at `path` (if any) stays as it was. Saving over the file the tensors were loaded from is
// safe (the mapping keeps the old file's bytes). Throws as write_safetensors, and Error(IoError).
void save_safetensors(const std::string& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace grouplin
