// Hostile files through the whole command: pickles built to make a reader hold far more memory
// than the file (tests/io/amplifying_pickles.hpp), run through `grouplin inspect` in a child
// process whose peak resident set is measured. The amplifying files of the fuzz corpus are
// generated here too, so that corpus and tests never drift apart.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "io/amplifying_pickles.hpp"
#include "io/memory_sink.hpp"
#include "io/zip.hpp"
#include "temp_dir_test.hpp"
#include "tools/cli_runner.hpp"

namespace grouplin {
namespace {

namespace fs = std::filesystem;
using test_pickle::Amplifier;
using test_pickle::kAmplifiers;

// A .pt archive as torch.save lays it out, around `pickle`, with one 4-byte storage "0".
std::string pt_archive(const std::string& pickle) {
  test_io::MemorySink sink;
  zip::ZipWriter w(sink);
  auto add = [&](const std::string& name, const std::string& data) {
    w.add_record(name, {reinterpret_cast<const std::byte*>(data.data()), data.size()});
  };
  add("archive/data.pkl", pickle);
  add("archive/byteorder", "little");
  add("archive/data/0", std::string(4, '\0'));
  add("archive/version", "3\n");
  w.finish();
  return {reinterpret_cast<const char*>(sink.bytes.data()), sink.bytes.size()};
}

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

// The fuzz corpora hold each amplifier at 136 KB, as a .pt (fuzz/corpus/pt/amplify_<name>.pt)
// and as a bare pickle (fuzz/corpus/pickle/amplify_<name>.pkl). Set GROUPLIN_UPDATE_CORPUS=1 to
// rewrite them after changing the generators.
TEST_F(HostileFiles, CorpusIsUpToDate) {
  const fs::path corpus = fs::path(GROUPLIN_SOURCE_DIR) / "fuzz" / "corpus";
  const bool update = std::getenv("GROUPLIN_UPDATE_CORPUS") != nullptr;
  for (const Amplifier& a : kAmplifiers) {
    const std::string pickle = a.make(136 << 10);
    const std::string name = "amplify_" + std::string(a.name);
    for (const auto& [file, want] : {std::pair{corpus / "pt" / (name + ".pt"), pt_archive(pickle)},
                                     std::pair{corpus / "pickle" / (name + ".pkl"), pickle}}) {
      if (update) std::ofstream(file, std::ios::binary) << want;
      EXPECT_TRUE(test_files::read_all(file) == want)
          << file << " differs from its generator: rerun with GROUPLIN_UPDATE_CORPUS=1";
    }
  }
}

}  // namespace
}  // namespace grouplin
