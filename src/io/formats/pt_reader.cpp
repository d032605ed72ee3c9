// Reading `.pt` files: zip directory → folder and records → data.pkl through the restricted
// pickle machine → storages resolved to records (exact sizes) → tensors as views or copies.
#include <algorithm>
#include <cstring>

#include "core/storage_stats.hpp"
#include "grouplin/error.hpp"
#include "grouplin/pt_file.hpp"
#include "io/formats/pickle_machine.hpp"
#include "io/formats/zip.hpp"

namespace grouplin {
namespace {

// Copies a strided tensor (elements inside `storage`, checked by the pickle machine) into a new
// row-major heap tensor. Requires: rank >= 1 and at least one element.
Tensor gather(const Storage& storage, const pickle::TensorRef& t) {
  Tensor out = Tensor::zeros(t.shape, t.dtype);
  const size_t esize = dtype_size(t.dtype);
  const std::byte* src = storage.data();
  std::byte* dst = out.mutable_data();
  const size_t rank = t.shape.size();
  const int64_t inner = t.shape[rank - 1];
  const int64_t inner_stride = t.stride[rank - 1];
  std::vector<int64_t> index(rank, 0);
  int64_t base = t.storage_offset;
  for (int64_t row = 0, rows = out.numel() / inner; row < rows; ++row) {
    for (int64_t j = 0; j < inner; ++j) {
      std::memcpy(dst, src + static_cast<size_t>(base + j * inner_stride) * esize, esize);
      dst += esize;
    }
    // Next row: odometer over the outer dimensions.
    for (size_t d = rank - 1; d-- > 0;) {
      if (++index[d] < t.shape[d]) {
        base += t.stride[d];
        break;
      }
      base -= (t.shape[d] - 1) * t.stride[d];
      index[d] = 0;
    }
  }
  detail::count_copied_bytes(out.nbytes());
  return out;
}

// MX scales in the layout TransformerEngine hands cuBLAS (TensorRef::mx_swizzled): the padded
// [R, C] bytes (R a multiple of 128, C of 4) are 128 x 4 tiles, row-tile by row-tile, each tile's
// scale (r, c) at byte (r % 32) * 16 + (r / 32) * 4 + c. Copied back to row-major order, the
// padding left out: a permutation, exact.
Tensor unswizzle_mx_scales(const Storage& storage, const pickle::TensorRef& t) {
  Tensor out = Tensor::zeros(t.shape, t.dtype);
  const std::byte* src = storage.data() + t.storage_offset;
  std::byte* dst = out.mutable_data();
  const int64_t padded_cols = t.mx_padded_cols;
  for (int64_t r = 0; r < t.shape[0]; ++r) {
    for (int64_t c = 0; c < t.shape[1]; ++c) {
      const int64_t tile = (r / 128) * (padded_cols / 4) + c / 4;
      const int64_t in_tile = (r % 32) * 16 + (r % 128 / 32) * 4 + c % 4;
      *dst++ = src[tile * 512 + in_tile];
    }
  }
  detail::count_copied_bytes(out.nbytes());
  return out;
}

StateDict parse(std::shared_ptr<Storage> bytes, const PtReadOptions& options) {
  const zip::ZipReader archive = zip::ZipReader::open(std::move(bytes));
  const auto& entries = archive.entries();
  if (entries.empty()) throw Error(ErrorCode::MissingRecord, "the archive has no records");

  // One top-level folder, whatever its name ("archive", the file's stem, ...).
  const std::string& first = entries.front().name;
  const size_t slash = first.find('/');
  if (slash == std::string::npos || slash == 0) {
    throw Error(ErrorCode::InvalidZip, "record " + quote(first) + " is not inside a folder");
  }
  const std::string folder = first.substr(0, slash + 1);
  for (const zip::Entry& e : entries) {
    if (e.name.compare(0, folder.size(), folder) != 0) {
      throw Error(ErrorCode::InvalidZip, "record " + quote(e.name) + " is outside the folder " +
                                             quote(folder) + " of the first record");
    }
  }
  const std::string data_folder = folder + "data/";
  if (options.check_record_crc) {
    for (const zip::Entry& e : entries) {
      if (e.name.compare(0, data_folder.size(), data_folder) != 0) archive.check_crc(e);
    }
  }

  const zip::Entry* pkl = archive.find(folder + "data.pkl");
  if (pkl == nullptr)
    throw Error(ErrorCode::MissingRecord, "no record " + quote(folder + "data.pkl"));
  if (const zip::Entry* order = archive.find(folder + "byteorder")) {
    auto b = archive.bytes(*order);
    std::string_view value(reinterpret_cast<const char*>(b.data()), b.size());
    if (value != "little") {
      throw Error(ErrorCode::UnknownFormat, "record " + quote(order->name) + " is " +
                                                quote(value.substr(0, 16)) +
                                                "; only little-endian files are read");
    }
  }

  pickle::PickledStateDict pickled;
  try {
    pickled = pickle::run_pickle(archive.bytes(*pkl), {}, options.state_dict_key);
  } catch (const Error& e) {
    throw Error(e.code(), "record " + quote(pkl->name) + " " + e.message());
  }

  // Storages: exact record sizes; zero-copy unless the record is misaligned for a dtype using it.
  std::vector<size_t> alignment(pickled.storages.size(), 1);
  for (const auto& [name, t] : pickled.tensors) {
    alignment[t.storage] = std::max(alignment[t.storage], dtype_size(t.dtype));
  }
  std::vector<std::shared_ptr<Storage>> storages;
  storages.reserve(pickled.storages.size());
  for (size_t i = 0; i < pickled.storages.size(); ++i) {
    const pickle::StorageRef& s = pickled.storages[i];
    const std::string record = data_folder + s.key;
    const zip::Entry* e = archive.find(record);
    if (e == nullptr) {
      throw Error(ErrorCode::MissingRecord,
                  "storage " + quote(s.key) + " (" + s.type + ") has no record " + quote(record));
    }
    if (e->size != s.nbytes()) {
      throw Error(ErrorCode::StorageSizeMismatch,
                  "record " + quote(record) + " has " + std::to_string(e->size) +
                      " bytes but storage " + quote(s.key) + " is " + s.type + " of " +
                      std::to_string(s.numel) + " elements (" + std::to_string(s.nbytes()) +
                      " bytes)");
    }
    if (options.check_storage_crc) archive.check_crc(*e);
    std::shared_ptr<Storage> storage = archive.storage(*e);
    if (reinterpret_cast<uintptr_t>(storage->data()) % alignment[i] != 0) {
      auto copy = Storage::allocate(storage->size());
      if (storage->size() != 0) std::memcpy(copy->mutable_data(), storage->data(), storage->size());
      detail::count_copied_bytes(storage->size());
      storage = std::move(copy);
    }
    storages.push_back(std::move(storage));
  }

  if (options.notes != nullptr) {
    for (Problem& n : pickled.notes) options.notes->push_back(std::move(n));
  }
  StateDict dict;
  for (auto& [name, t] : pickled.tensors) {
    const std::shared_ptr<Storage>& storage = storages[t.storage];
    if (t.mx_swizzled) {
      dict.insert(std::move(name), unswizzle_mx_scales(*storage, t));
    } else if (pickle::is_contiguous(t.shape, t.stride)) {
      const size_t offset = static_cast<size_t>(t.storage_offset) * dtype_size(t.dtype);
      dict.insert(std::move(name), Tensor::view_of(storage, offset, t.shape, t.dtype));
    } else {
      dict.insert(std::move(name), gather(*storage, t));
    }
  }
  return dict;
}

}  // namespace

StateDict parse_pt(std::shared_ptr<Storage> bytes, const std::string& name_for_errors,
                   const PtReadOptions& options) {
  if (!bytes) throw Error(ErrorCode::InvalidArgument, "parse_pt: null storage");
  try {
    return parse(std::move(bytes), options);
  } catch (const Error& e) {
    throw Error(e.code(), "loading " + quote(name_for_errors) + ": " + e.message());
  }
}

StateDict load_pt(const std::string& path, const PtReadOptions& options, MapMode mode) {
  std::shared_ptr<MappedFile> file = MappedFile::open(path, mode);
  return parse_pt(file->storage(0, file->size()), path, options);
}

}  // namespace grouplin
