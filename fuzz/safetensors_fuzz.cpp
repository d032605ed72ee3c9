// libFuzzer target for the safetensors reader: any input must either parse or throw
// grouplin::Error; anything else (a crash, a sanitizer report, another exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "grouplin/error.hpp"
#include "grouplin/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto bytes = grouplin::Storage::allocate(size);
  if (size != 0) std::memcpy(bytes->mutable_data(), data, size);
  try {
    grouplin::SafetensorsFile file = grouplin::parse_safetensors(bytes, "fuzz.safetensors");
    // Touch every byte of every view, so the sanitizers see any out-of-bounds range.
    uint64_t sum = 0;
    for (const auto& [name, t] : file.tensors) {
      const auto* p = reinterpret_cast<const uint8_t*>(t.data());
      for (size_t i = 0; i < t.nbytes(); ++i) sum += p[i];
    }
    volatile uint64_t keep = sum;  // the loop must not be optimised away
    (void)keep;
  } catch (const grouplin::Error&) {
  }
  return 0;
}
