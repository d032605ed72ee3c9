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
// Every input goes through one validator (src/io/formats/safetensors_layout.hpp, which also plans
// the streaming reads and writes of `convert`), in this order, each failure with its own ErrorCode
// and a message naming the file, the tensor and the bad value:
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
// storage (no copy of the whole file). The header is run through the validator above before
// anything is written. Does not call sink.commit().
// Throws Error(UndefinedTensor) for an undefined tensor, Error(InvalidArgument) for a name that is
// not UTF-8 or is "__metadata__", Error(InvalidMetadata) for metadata that is not UTF-8,
// Error(HeaderTooLarge) past the cap, and whatever sink.write throws.
void write_safetensors(FileSink& sink, const StateDict& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// write_safetensors to an AtomicFile at `path`, then commit(): on any error, or a crash, the old
// file at `path` (if any) stays as it was. Saving over the file the tensors were loaded from is
// safe (the mapping keeps the old file's bytes). Throws as write_safetensors, and Error(IoError).
void save_safetensors(const std::string& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace grouplin
