// Test helper: .pt archives in memory from (record name, bytes) pairs, as the .pt tests build
// them around hand-made pickles (io/pickle_builder.hpp).
//
//   auto file = test_io::to_storage(test_io::archive({{"archive/data.pkl", pickle}, ...}));
#pragma once

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "grouplin/storage.hpp"
#include "io/formats/zip.hpp"
#include "io/memory_sink.hpp"

namespace grouplin::test_io {

using Records = std::vector<std::pair<std::string, std::string>>;

// A stored (uncompressed) ZIP archive of `records`, in order.
inline std::vector<std::byte> archive(const Records& records,
                                      zip::ZipWriter::Options options = {}) {
  MemorySink sink;
  zip::ZipWriter w(sink, options);
  for (const auto& [name, data] : records) {
    w.add_record(name, {reinterpret_cast<const std::byte*>(data.data()), data.size()});
  }
  w.finish();
  return sink.bytes;
}

// `bytes` in a Storage of their own.
inline std::shared_ptr<Storage> to_storage(const std::vector<std::byte>& bytes) {
  auto s = Storage::allocate(bytes.size());
  if (!bytes.empty()) std::memcpy(s->mutable_data(), bytes.data(), bytes.size());
  return s;
}

}  // namespace grouplin::test_io
