// A FileSink that keeps what is written in memory, for tests of the writers and readers; it can
// fail on purpose after a given number of bytes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "grouplin/error.hpp"
#include "grouplin/file.hpp"

namespace grouplin::test_io {

class MemorySink : public FileSink {
 public:
  void write(std::span<const std::byte> b) override {
    if (fail_after_ != SIZE_MAX && bytes.size() + b.size() > fail_after_) {
      throw Error(ErrorCode::IoError, "injected failure");
    }
    largest_write = std::max(largest_write, b.size());
    bytes.insert(bytes.end(), b.begin(), b.end());
  }
  uint64_t position() const override { return bytes.size(); }
  void commit() override {}
  std::vector<std::byte> bytes;
  size_t largest_write = 0;
  size_t fail_after_ = SIZE_MAX;  // a write that would pass this many bytes throws IoError
};

}  // namespace grouplin::test_io
