// libFuzzer target for the restricted pickle machine alone: any input must either run or throw
// grouplin::Error, and nothing may hold much more memory than the input (the run's
// -rss_limit_mb / -malloc_limit_mb turn any amplification into a failure). The .pt target
// reaches the machine only through a zip archive whose CRC random mutations rarely keep; this
// one feeds it pickles directly, seeded with torch's own and hand-made hostile ones. Inputs past
// GROUPLIN_FUZZ_MAX_LEN are skipped (fuzz/CMakeLists.txt): their cost grows with their size, and
// the amplifying pickles are unit tests (tests/io/pickle_machine_test.cpp).
#include <cstddef>
#include <cstdint>

#include "grouplin/error.hpp"
#include "io/formats/pickle_machine.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > GROUPLIN_FUZZ_MAX_LEN) return 0;
  try {
    grouplin::pickle::PickledStateDict r =
        grouplin::pickle::run_pickle({reinterpret_cast<const std::byte*>(data), size});
    // Every tensor lies inside its storage by contract: check what the machine promised.
    for (const auto& [name, t] : r.tensors) {
      if (t.storage >= r.storages.size() || t.shape.size() != t.stride.size()) __builtin_trap();
    }
  } catch (const grouplin::Error&) {
  }
  return 0;
}
