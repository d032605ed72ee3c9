// Private: the .pt archive writer that write_pt and streaming converters share, so that every
// .pt file GroupLin writes has one pickle emitter and one record layout.
// (write_pt_archive below; PtArchive when the record offsets are wanted before writing.)
//
//   std::vector<grouplin::detail::PtRecordSpec> records = {{"0", 64}};
//   std::vector<grouplin::detail::PtTensorSpec> tensors = {
//       {"fc.weight", DType::F32, {4, 4}, /*record=*/0, /*storage_offset=*/0}};
//   grouplin::detail::write_pt_archive(sink, tensors, records, "writing .pt",
//                                      [&](size_t i, zip::ZipWriter& z) {
//     z.write(bytes_of_record(i));  // exactly records[i].nbytes bytes, in any number of pieces
//     return std::nullopt;          // the zip writer computed the CRC-32 itself
//   });
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "grouplin/dtype.hpp"
#include "grouplin/file.hpp"
#include "grouplin/tensor.hpp"
#include "io/formats/pickle_machine.hpp"
#include "io/formats/zip.hpp"

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

// The archive torch.save writes for an OrderedDict of `tensors` (in this order): data.pkl,
// byteorder, the storage records in the order given, version, the directory. Built in two steps
// so that a caller can learn where every record's data will lie before writing anything.
class PtArchive {
 public:
  // Builds data.pkl (checked by running it through the reader's pickle machine with `limits`)
  // and lays out the records as the zip writer will, for a sink at `start_position`. `context`
  // starts every error message (`saving "out.pt"`), which names the tensor when it is about one.
  // Throws Error(InvalidArgument) for a name that is not UTF-8, Error(PickleLimitExceeded) for
  // what the reader would refuse under `limits` (a name over max_string bytes, a tensor of more
  // than max_rank dimensions, a pickle over max_bytes), Error(InvalidPickle) if the pickle does
  // not read back. Requires: every tensor lies inside its record; keys are distinct.
  PtArchive(std::span<const PtTensorSpec> tensors, std::span<const PtRecordSpec> records,
            uint64_t start_position, std::string context, const pickle::PickleLimits& limits = {});

  // File offset of the first data byte of storage record i.
  uint64_t record_data_offset(size_t i) const { return data_offsets_[2 + i]; }

  // Writes the archive to `sink` (not committed; Error(InvalidArgument) unless it is at
  // `start_position`). The bytes of storage record i are streamed by write_record(i, zip) with
  // zip.write or zip.write_without_crc (exactly its nbytes); it returns the record's CRC-32 when
  // it used write_without_crc, nullopt to let the zip writer use its own. Throws what the zip
  // writer throws (messages starting with `context`) when write_record writes too few or too
  // many bytes, and whatever write_record and the sink throw.
  void write(
      FileSink& sink,
      const std::function<std::optional<uint32_t>(size_t, zip::ZipWriter&)>& write_record) const;

 private:
  uint64_t start_position_;
  std::string context_;
  std::vector<std::byte> pickle_;
  std::vector<std::string> names_;      // every record, in file order
  std::vector<uint64_t> sizes_;         // their sizes
  std::vector<uint64_t> data_offsets_;  // where their data start
};

// PtArchive(tensors, records, sink.position(), context).write(sink, write_record).
void write_pt_archive(
    FileSink& sink, std::span<const PtTensorSpec> tensors, std::span<const PtRecordSpec> records,
    const std::string& context,
    const std::function<std::optional<uint32_t>(size_t, zip::ZipWriter&)>& write_record);

}  // namespace grouplin::detail
