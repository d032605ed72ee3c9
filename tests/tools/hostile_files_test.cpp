// Hostile files through the whole command: pickles built to make a reader hold far more memory
// than the file (tests/io/amplifying_pickles.hpp), run through `grouplin inspect` in a child
// process whose peak resident set is measured; and the fuzz corpora, kept free of them.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "io/amplifying_pickles.hpp"
#include "temp_dir_test.hpp"
#include "tools/cli_runner.hpp"

namespace grouplin {
namespace {

namespace fs = std::filesystem;
using test_pickle::Amplifier;
using test_pickle::kAmplifiers;
using test_pickle::pt_archive;

class HostileFiles : public test_files::TempDirTest {
 protected:
  HostileFiles() : TempDirTest("grouplin_hostile") {}
};

// Regression: a 136 KB .pt (one 64 KiB key reused by thousands of dicts) made `grouplin inspect`
// grow to 650 MB before refusing it, and a few MB of pickle could ask for tens of GB. Now every
// amplifying pickle is refused with the process under 64 MiB + 16 x the pickle's size.
TEST_F(HostileFiles, AmplifyingPicklesStayUnderTheMemoryBound) {
  if (kUnderAddressSanitizer) {
    GTEST_SKIP() << "AddressSanitizer's shadow memory and quarantine blur resident-set figures";
  }
  for (const Amplifier& a : kAmplifiers) {
    for (size_t size : {size_t{136} << 10, size_t{2} << 20}) {
      const std::string pickle = a.make(size);
      const std::string file = path(std::string(a.name) + ".pt");
      std::ofstream(file, std::ios::binary) << pt_archive(pickle);
      const CliRun r = run_cli(dir_, {"inspect", file});
      const long bound_kib = 64 * 1024 + static_cast<long>(16 * pickle.size() / 1024);
      SCOPED_TRACE(std::string(a.name) + ", " + std::to_string(pickle.size()) + " bytes");
      // aliased_entries is a valid state dict while it is small.
      if (r.code != 0) {
        EXPECT_EQ(r.code, 2) << r.err;
        EXPECT_NE(r.err.find("data.pkl"), std::string::npos) << r.err;
      }
      EXPECT_LE(r.max_rss_kib, bound_kib);
      std::printf("%-18s %8zu bytes of pickle: peak %6ld KiB (bound %6ld), exit %d\n", a.name,
                  pickle.size(), r.max_rss_kib, bound_kib, r.code);
    }
  }
}

// Regression: the fuzz corpora held each amplifier at 136 KB, on which the .pt and pickle fuzzers
// spent up to 8 s per input under AddressSanitizer (3 and 19 inputs/s in all). They are unit
// tests now (tests/io/pickle_machine_test.cpp, tests/io/pt_reader_test.cpp, and the test above),
// and every corpus input fits the fuzzers' cap (GROUPLIN_FUZZ_MAX_LEN in fuzz/CMakeLists.txt).
TEST_F(HostileFiles, TheFuzzCorporaHoldNoAmplifierAndNothingPastTheCap) {
  constexpr uintmax_t kFuzzMaxLen = 65536;
  size_t files = 0;
  for (const auto& e :
       fs::recursive_directory_iterator(fs::path(GROUPLIN_SOURCE_DIR) / "fuzz" / "corpus")) {
    if (!e.is_regular_file()) continue;
    ++files;
    EXPECT_EQ(e.path().filename().string().rfind("amplify_", 0), std::string::npos) << e.path();
    EXPECT_LE(e.file_size(), kFuzzMaxLen) << e.path();
  }
  EXPECT_GT(files, 100u);
}

}  // namespace
}  // namespace grouplin
