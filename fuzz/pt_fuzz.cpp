// libFuzzer target for the .pt reader: any input must either parse or throw grouplin::Error.
// What parses is read end to end (ASan sees any view outside its storage), written back with
// write_pt and parsed again: the writer must produce what the reader accepts, with equal values.
// Inputs past GROUPLIN_FUZZ_MAX_LEN are skipped (fuzz/CMakeLists.txt): their cost grows with their
// size, and the amplifying .pt files are unit tests (tests/io/pt_reader_test.cpp).
#include <cstdint>
#include <cstring>

#include "grouplin/error.hpp"
#include "grouplin/pt_file.hpp"

namespace {

class MemorySink : public grouplin::FileSink {
 public:
  void write(std::span<const std::byte> b) override {
    bytes.insert(bytes.end(), b.begin(), b.end());
  }
  uint64_t position() const override { return bytes.size(); }
  void commit() override {}
  std::vector<std::byte> bytes;
};

volatile unsigned g_sink;

void check(const grouplin::StateDict& sd) {
  unsigned sum = 0;
  for (const auto& [name, t] : sd) {
    for (size_t i = 0; i < t.nbytes(); ++i) sum += std::to_integer<unsigned>(t.data()[i]);
  }
  g_sink = sum;
  try {
    MemorySink sink;
    grouplin::write_pt(sink, sd);
    auto bytes = grouplin::Storage::allocate(sink.bytes.size());
    std::memcpy(bytes->mutable_data(), sink.bytes.data(), sink.bytes.size());
    grouplin::StateDict back = grouplin::parse_pt(bytes, "rewritten.pt");
    if (back.keys() != sd.keys()) __builtin_trap();
    for (const auto& [name, t] : sd) {
      if (!t.bit_equal(back.at(name))) __builtin_trap();
    }
  } catch (const grouplin::Error&) {
    __builtin_trap();  // what the reader accepted, the writer must write and the reader reread
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > GROUPLIN_FUZZ_MAX_LEN) return 0;
  auto bytes = grouplin::Storage::allocate(size);
  if (size != 0) std::memcpy(bytes->mutable_data(), data, size);
  try {
    check(grouplin::parse_pt(bytes, "fuzz.pt"));
  } catch (const grouplin::Error& e) {
    // Random mutations rarely keep a CRC right: look behind the check too, so that the pickle
    // machine gets fuzzed through mutated files.
    if (e.code() != grouplin::ErrorCode::CrcMismatch) return 0;
    try {
      check(grouplin::parse_pt(bytes, "fuzz.pt", {.check_record_crc = false}));
    } catch (const grouplin::Error&) {
    }
  }
  return 0;
}
