// Private: the .pt archive writer that write_pt and streaming converters share, so that every
// .pt file GroupLin writes has one pickle emitter and one record layout.
//
//   std::vector<grouplin::detail::PtRecordSpec> records = {{"0", 64}};
//   std::vector<grouplin::detail::PtTensorSpec> tensors = {{"fc.weight", DType::F32, {4, 4}, 0, 0}};
//   grouplin::detail::write_pt_archive(sink, tensors, records, [&](size_t i, zip::ZipWriter& z) {
//     z.write(bytes_of_record(i));   // exactly records[i].nbytes bytes, in as many pieces as wanted
//     return std::nullopt;           // the zip writer computed the CRC-32 itself
//   });
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>

#include "grouplin/dtype.hpp"
#include "grouplin/file.hpp"
#include "grouplin/tensor.hpp"
#include "io/zip.hpp"

namespace grouplin::detail {

// A storage record "archive/data/<key>" of `nbytes` bytes.
struct PtRecordSpec {
  std::string key;
  uint64_t nbytes = 0;
};

// A tensor of the state dict: row-major, `storage_offset` elements into record `record`, whose
// tensors all have this dtype.
struct PtTensorSpec {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  size_t record = 0;
  int64_t storage_offset = 0;
};

// Writes the archive torch.save writes for an OrderedDict of `tensors` (in this order) to `sink`
// (not committed): data.pkl (checked by running it through the reader's pickle machine first),
// byteorder, the records in the order given, whose bytes write_record(i, zip) must stream with
// zip.write or zip.copy_from_file (exactly records[i].nbytes bytes; it returns the record's
// CRC-32 when it used copy_from_file, nullopt to let the zip writer use its own), then version
// and the directory.
// Throws Error(InvalidArgument) for a name that is not UTF-8, Error(InvalidPickle) if the pickle
// does not read back, what the zip writer throws when write_record writes too few or too many
// bytes, and whatever write_record and the sink throw.
// Requires: every tensor lies inside its record; keys are distinct.
void write_pt_archive(
    FileSink& sink, std::span<const PtTensorSpec> tensors, std::span<const PtRecordSpec> records,
    const std::function<std::optional<uint32_t>(size_t, zip::ZipWriter&)>& write_record);

}  // namespace grouplin::detail
