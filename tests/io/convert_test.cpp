// Streaming conversion and comparison through the library (the CLI tests in tests/tools/ run the
// same through the command line), the zip writer's caller-computed CRC, and the fast CRC-32.
#include "grouplin/convert.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "grouplin/checkpoint.hpp"
#include "grouplin/compare.hpp"
#include "grouplin/error.hpp"
#include "grouplin/inspect.hpp"
#include "grouplin/pt_file.hpp"
#include "grouplin/safetensors.hpp"
#include "io/checkpoints/checkpoint_source.hpp"
#include "io/formats/pt_writer.hpp"
#include "io/formats/zip.hpp"
#include "io/moe_checkpoint.hpp"
#include "temp_dir_test.hpp"

namespace grouplin {
namespace {

namespace fs = std::filesystem;
using testing::moe_state_dict;
using testing::MoeModuleSpec;

const std::vector<MoeModuleSpec> kModules = {
    {"model.layers.3.mlp.experts.", 4, 3, 5, true, DType::BF16},
    {"model.layers.7.mlp.experts.", 1, 2, 6, false, DType::F32},
    {"empty.", 2, 0, 3, true, DType::F16},  // zero-size experts: empty tensors and records
};

using test_files::read_all;

class ConvertTest : public test_files::TempDirTest {
 protected:
  ConvertTest() : TempDirTest("grouplin_convert") {}

  size_t files_in_dir() const {
    return static_cast<size_t>(
        std::distance(fs::directory_iterator(dir_), fs::directory_iterator()));
  }
  static void expect_dict(const StateDict& got, const StateDict& want) {
    ASSERT_EQ(got.keys(), want.keys());
    for (const auto& [name, t] : want) EXPECT_TRUE(t.bit_equal(got.at(name))) << name;
  }
};

TEST_F(ConvertTest, EveryLayoutAndFormat) {
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"origin", "test"}};
  for (CheckpointFormat in_format : {CheckpointFormat::Safetensors, CheckpointFormat::Pt}) {
    for (ExpertLayout from : {ExpertLayout::PerExpert, ExpertLayout::Single}) {
      const std::string in = path("in");
      save_checkpoint(in, moe_state_dict(kModules, from), in_format, meta);
      for (CheckpointFormat out_format : {CheckpointFormat::Safetensors, CheckpointFormat::Pt}) {
        for (ExpertLayout to : {ExpertLayout::PerExpert, ExpertLayout::Single}) {
          SCOPED_TRACE(std::string(format_name(in_format)) + " " + std::string(layout_name(from)) +
                       " -> " + std::string(format_name(out_format)) + " " +
                       std::string(layout_name(to)));
          ConvertOptions o;
          o.layout = to;
          o.format = out_format;
          o.overwrite = true;
          uint64_t last_done = 0, last_total = 0;
          o.progress = [&](uint64_t done, uint64_t total) {
            EXPECT_GE(done, last_done);
            last_done = done;
            last_total = total;
          };
          const ConvertReport r = convert_checkpoint(in, path("out"), o);
          EXPECT_EQ(r.input_format, in_format);
          EXPECT_EQ(r.output_format, out_format);
          ASSERT_EQ(r.modules.size(), 3u);
          EXPECT_EQ(r.modules[0].layout, from);
          EXPECT_EQ(last_done, last_total);
          EXPECT_EQ(last_total, r.data_bytes);
          EXPECT_EQ(r.file_bytes, fs::file_size(path("out")));
          const Checkpoint c = load_checkpoint(path("out"));
          EXPECT_EQ(c.format, out_format);
          const StateDict want = moe_state_dict(kModules, to);
          for (const auto& [name, t] : want) EXPECT_TRUE(t.bit_equal(c.tensors.at(name))) << name;
          EXPECT_EQ(c.tensors.size(), want.size());
          if (out_format == CheckpointFormat::Pt) {
            // A .pt file keeps the input's order (a safetensors input's is its data order).
            if (in_format == CheckpointFormat::Pt) expect_dict(c.tensors, want);
            load_pt(path("out"), {.check_record_crc = true, .check_storage_crc = true});
          } else {
            // Metadata is kept from a safetensors input; a .pt input has none.
            if (in_format == CheckpointFormat::Safetensors) {
              EXPECT_EQ(c.metadata, meta);
            } else {
              EXPECT_TRUE(c.metadata.empty());
            }
          }
          EXPECT_TRUE(compare_checkpoints(in, path("out")).same);
        }
      }
    }
  }
  EXPECT_EQ(files_in_dir(), 2u);  // in, out: no temporary file left
}

// Tensors larger than the copy pipeline's buffers, in pieces that are not multiples of them, in
// every direction and format: the bytes and the .pt CRCs come out right.
TEST_F(ConvertTest, LargeTensorsThroughThePipeline) {
  const std::vector<MoeModuleSpec> big = {{"a.", 3, 301, 517, true, DType::F32},  // ~608 KiB each
                                          {"b.", 5, 64, 1000, false, DType::BF16}};
  for (ExpertLayout from : {ExpertLayout::PerExpert, ExpertLayout::Single}) {
    save_safetensors(path("in.safetensors"), moe_state_dict(big, from));
    for (const char* out : {"out.safetensors", "out.pt"}) {
      ConvertOptions o;
      o.layout = from == ExpertLayout::Single ? ExpertLayout::PerExpert : ExpertLayout::Single;
      o.overwrite = true;
      convert_checkpoint(path("in.safetensors"), path(out), o);
      const StateDict want = moe_state_dict(big, *o.layout);
      const StateDict got =
          std::string(out) == "out.pt"
              ? load_pt(path(out), {.check_record_crc = true, .check_storage_crc = true})
              : load_safetensors(path(out)).tensors;
      EXPECT_EQ(got.size(), want.size());
      for (const auto& [name, t] : want) EXPECT_TRUE(t.bit_equal(got.at(name))) << out << name;
    }
  }
}

// Regression guard for the byte-exact promise: per-expert -> single -> per-expert reproduces a
// file GroupLin wrote, byte for byte, in both formats.
TEST_F(ConvertTest, RoundTripIsByteIdentical) {
  const StateDict sd = moe_state_dict(kModules, ExpertLayout::PerExpert);
  for (CheckpointFormat f : {CheckpointFormat::Safetensors, CheckpointFormat::Pt}) {
    save_checkpoint(path("a"), sd, f, {{"k", "v"}});
    ConvertOptions o;
    o.format = f;
    o.overwrite = true;
    o.layout = ExpertLayout::Single;
    convert_checkpoint(path("a"), path("b"), o);
    o.layout = ExpertLayout::PerExpert;
    convert_checkpoint(path("b"), path("c"), o);
    EXPECT_EQ(read_all(path("a")), read_all(path("c"))) << format_name(f);
    // single -> single is the identity too.
    o.layout = ExpertLayout::Single;
    convert_checkpoint(path("b"), path("d"), o);
    EXPECT_EQ(read_all(path("b")), read_all(path("d"))) << format_name(f);
  }
}

TEST_F(ConvertTest, RefusesInAsOutAndExistingOut) {
  save_safetensors(path("in.safetensors"), moe_state_dict(kModules, ExpertLayout::PerExpert));
  const std::string before = read_all(path("in.safetensors"));
  ConvertOptions o;
  o.overwrite = true;
  for (const std::string& out :
       {path("in.safetensors"), (dir_ / "." / "in.safetensors").string()}) {
    try {
      convert_checkpoint(path("in.safetensors"), out, o);
      FAIL() << "converted over the input";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
      EXPECT_NE(e.message().find("is the input"), std::string::npos) << e.what();
    }
  }
  fs::create_hard_link(path("in.safetensors"), path("link.safetensors"));
  EXPECT_THROW(convert_checkpoint(path("in.safetensors"), path("link.safetensors"), o), Error);
  EXPECT_EQ(read_all(path("in.safetensors")), before);

  std::ofstream(path("out.safetensors")) << "old";
  o.overwrite = false;
  try {
    convert_checkpoint(path("in.safetensors"), path("out.safetensors"), o);
    FAIL() << "replaced an existing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(e.message().find("already exists"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_all(path("out.safetensors")), "old");
  o.overwrite = true;
  convert_checkpoint(path("in.safetensors"), path("out.safetensors"), o);
  EXPECT_NE(read_all(path("out.safetensors")), "old");
}

TEST_F(ConvertTest, BadInputLeavesNoOutput) {
  StateDict partial = moe_state_dict(kModules, ExpertLayout::PerExpert);
  partial.erase("model.layers.3.mlp.experts.weight1");
  save_safetensors(path("partial.safetensors"), partial);
  std::ofstream(path("garbage.safetensors")) << "not a checkpoint at all";
  save_safetensors(path("good.safetensors"), moe_state_dict(kModules, ExpertLayout::PerExpert));
  const std::string good = read_all(path("good.safetensors"));
  std::ofstream(path("truncated.safetensors"), std::ios::binary)
      << good.substr(0, good.size() - 10);
  const std::pair<const char*, ErrorCode> cases[] = {
      {"partial.safetensors", ErrorCode::PartialExpertSet},
      {"garbage.safetensors", ErrorCode::UnknownFormat},
      {"truncated.safetensors", ErrorCode::Truncated},
      {"missing.safetensors", ErrorCode::IoError},
  };
  for (const auto& [name, code] : cases) {
    try {
      convert_checkpoint(path(name), path("out.safetensors"));
      FAIL() << name << " converted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(e.message().find(name), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(path("out.safetensors"))) << name;
  }
  // No format from the extension, none given.
  try {
    convert_checkpoint(path("good.safetensors"), path("out.weights"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::UnknownFormat) << e.what();
  }
  EXPECT_EQ(files_in_dir(), 4u);
}

// A .pt OUT refuses what the .pt reader would refuse, before OUT is written, naming OUT and the
// tensor (a safetensors IN may hold names longer than a .pt file allows).
TEST_F(ConvertTest, PtOutputRefusesWhatItsReaderWouldNaming) {
  StateDict sd = moe_state_dict(kModules, ExpertLayout::PerExpert);
  sd.insert(std::string(70000, 'n'), Tensor::zeros({2}, DType::F32));
  save_safetensors(path("in.safetensors"), sd);
  try {
    convert_checkpoint(path("in.safetensors"), path("out.pt"));
    FAIL() << "converted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::PickleLimitExceeded);
    EXPECT_EQ(e.message(), "saving " + grouplin::quote(path("out.pt")) + ": tensor \"" +
                               std::string(512, 'n') +
                               "\"... (70000 bytes): a name of 70000 bytes, more than the 65536 "
                               "the .pt reader accepts");
  }
  EXPECT_EQ(files_in_dir(), 1u);
}

// IN shrinking while it is converted (another program truncating it): convert reads tensor bytes
// with pread, so the short read is Error(Truncated) naming IN, the tensor and the byte counts
// (touching mapped pages past the new end would have been a SIGBUS, a crash); nothing is left
// at OUT. The progress callback cuts the file: before the first byte is read (at a place in the
// middle of "big.weight2"), and after the first 16 MiB have been written, when the reader
// thread is at most its four 256 KiB buffers ahead, to 8 MiB.
TEST_F(ConvertTest, InputShrinkingMidwayIsTruncatedAndLeavesNothing) {
  const std::vector<MoeModuleSpec> big = {{"big.", 6, 1024, 1024, false, DType::F32}};  // 24 MiB
  const StateDict sd = moe_state_dict(big, ExpertLayout::PerExpert, /*extras=*/false);
  for (CheckpointFormat in_format : {CheckpointFormat::Safetensors, CheckpointFormat::Pt}) {
    for (const char* out_name : {"out.safetensors", "out.pt"}) {
      for (const bool midway : {false, true}) {
        const std::string in = path("in");
        const std::string out = path(out_name);
        SCOPED_TRACE(std::string(format_name(in_format)) + " -> " + out_name +
                     (midway ? ", cut after 16 MiB" : ", cut at the start"));
        save_checkpoint(in, sd, in_format);
        const uint64_t size = fs::file_size(in);
        uint64_t w2 = 0;  // where big.weight2 starts in IN
        {
          auto src = detail::CheckpointSource::open(in);
          w2 = src->locate(src->tensors().at("big.weight2"))->second;
        }
        const uint64_t cut = midway ? uint64_t{8} << 20 : w2 + 1000;
        bool cut_done = false;
        ConvertOptions o;
        o.layout = ExpertLayout::Single;  // reads weight0, weight1, ... in order
        o.progress = [&](uint64_t done, uint64_t) {
          if (!cut_done && (done > 0) == midway) {
            fs::resize_file(in, cut);
            cut_done = true;
          }
        };
        try {
          convert_checkpoint(in, out, o);
          FAIL() << "converted";
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), ErrorCode::Truncated) << e.what();
          const std::string tail = ": it now has " + std::to_string(cut) + " bytes, " +
                                   std::to_string(size) +
                                   " when opened (was it changed while being read?)";
          if (midway) {
            EXPECT_EQ(
                e.message().rfind("reading " + grouplin::quote(in) + ": tensor \"big.weight", 0),
                0u)
                << e.message();
            EXPECT_TRUE(e.message().ends_with(tail)) << e.message();
          } else {
            EXPECT_EQ(e.message(), "reading " + grouplin::quote(in) +
                                       ": tensor \"big.weight2\" lies at bytes [" +
                                       std::to_string(w2) + ", " + std::to_string(w2 + (4 << 20)) +
                                       ") of the file, but the file ended at byte " +
                                       std::to_string(cut) + tail);
          }
        }
        EXPECT_TRUE(cut_done);
        EXPECT_EQ(files_in_dir(), 1u);  // IN only: neither OUT nor a temporary file
      }
    }
  }
}

TEST_F(ConvertTest, ProgressCallbackCanAbort) {
  save_safetensors(path("in.safetensors"), moe_state_dict(kModules, ExpertLayout::PerExpert));
  ConvertOptions o;
  o.progress = [](uint64_t done, uint64_t) {
    if (done > 0) throw Error(ErrorCode::IoError, "stop");
  };
  EXPECT_THROW(convert_checkpoint(path("in.safetensors"), path("out.pt"), o), Error);
  EXPECT_FALSE(fs::exists(path("out.pt")));
  EXPECT_EQ(files_in_dir(), 1u);
}

// Never a silent no-op: asked for a change it cannot make at all, a conversion fails with a named
// code and writes nothing; asked for several, it makes what it can and warns about the rest.
TEST_F(ConvertTest, NothingToChangeIsAnErrorAndAPartialChangeAWarning) {
  auto code_of = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::InvalidArgument;  // "no error": no test expects this code
  };
  auto codes = [](const ConvertReport& r) {
    std::vector<ErrorCode> out;
    for (const Problem& w : r.warnings) out.push_back(w.code);
    return out;
  };
  StateDict dense;
  dense.insert("a.weight", Tensor::zeros({4, 4}, DType::F32));
  save_safetensors(path("dense.safetensors"), dense);
  ConvertOptions o;
  EXPECT_EQ(
      code_of([&] { convert_checkpoint(path("dense.safetensors"), path("a.safetensors"), o); }),
      ErrorCode::NoGroupedModules);
  EXPECT_FALSE(fs::exists(path("a.safetensors")));
  ConvertOptions sliced;
  sliced.experts = ExpertRange{0, 1};
  EXPECT_EQ(code_of([&] { convert_checkpoint(path("dense.safetensors"), path("b.pt"), sliced); }),
            ErrorCode::NoGroupedModules);
  EXPECT_FALSE(fs::exists(path("b.pt")));
  // A change of format is made: the layout's part is a warning.
  EXPECT_EQ(codes(convert_checkpoint(path("dense.safetensors"), path("c.pt"), o)),
            std::vector<ErrorCode>{ErrorCode::NoGroupedModules});
  expect_dict(load_pt(path("c.pt")), dense);

  // Experts without FP8 weights, and FP8 scales whose weight is not there.
  StateDict te = moe_state_dict({{"m.", 2, 3, 5, false, DType::BF16}}, ExpertLayout::PerExpert);
  te.insert("o_proj.weight_scale_inv", Tensor::zeros({1, 1}, DType::F32));
  save_safetensors(path("te.safetensors"), te);
  ConvertOptions bf16;
  bf16.dtype = DType::BF16;
  const ConvertReport r = convert_checkpoint(path("te.safetensors"), path("d.safetensors"), bf16);
  EXPECT_EQ(codes(r), (std::vector<ErrorCode>{ErrorCode::NothingToDequantize,
                                              ErrorCode::ScaleWithoutWeight}));
  EXPECT_EQ(r.warnings[1].key, "o_proj.weight_scale_inv");
  // The summary names the rules and whence they came.
  EXPECT_EQ(r.rules, std::vector<std::string>{"te"});
  EXPECT_EQ(r.rules_from, RulesFrom::Names);
  ConvertOptions given;
  given.rules = {builtin_rules("te")};
  EXPECT_EQ(convert_checkpoint(path("te.safetensors"), path("e.safetensors"), given).rules_from,
            RulesFrom::Given);
  EXPECT_TRUE(load_checkpoint(path("d.safetensors")).tensors.contains("o_proj.weight_scale_inv"));
  // Modules already per-expert, the same format, and no FP8 weight: --dtype changes nothing.
  ConvertOptions kept = bf16;
  kept.layout = ExpertLayout::PerExpert;
  EXPECT_EQ(
      code_of([&] { convert_checkpoint(path("te.safetensors"), path("f.safetensors"), kept); }),
      ErrorCode::NothingToDequantize);
  EXPECT_FALSE(fs::exists(path("f.safetensors")));
  // inspect names the scales as a problem.
  const CheckpointSummary s = inspect_checkpoint(path("te.safetensors"));
  ASSERT_EQ(s.scan.problems.size(), 1u);
  EXPECT_EQ(s.scan.problems[0].code(), ErrorCode::ScaleWithoutWeight);
}

TEST_F(ConvertTest, CompareListsDifferences) {
  StateDict a = moe_state_dict(kModules, ExpertLayout::PerExpert);
  save_pt(path("a.pt"), a);
  StateDict b = moe_state_dict(kModules, ExpertLayout::PerExpert);
  Tensor w = b.at("model.layers.7.mlp.experts.weight0").clone();
  w.mutable_data_as<float>()[7] = 42.0f;  // element [1, 1] of a [2, 6] weight
  b.set("model.layers.7.mlp.experts.weight0", w);
  b.erase("step");
  b.insert("extra", Tensor::zeros({1}, DType::I8));
  save_safetensors(path("b.safetensors"), b);
  const CompareReport r = compare_checkpoints(path("a.pt"), path("b.safetensors"));
  EXPECT_FALSE(r.same);
  EXPECT_EQ(r.differing, 3u);
  ASSERT_EQ(r.differences.size(), 3u);
  EXPECT_NE(
      r.differences[0].find("\"model.layers.7.mlp.experts.weight0\": 1 of 12 elements differ, "
                            "first at [1, 1]: "),
      std::string::npos)
      << r.differences[0];
  EXPECT_NE(r.differences[0].find("vs 42"), std::string::npos) << r.differences[0];
  EXPECT_EQ(r.differences[1], "\"step\": only in A");
  EXPECT_EQ(r.differences[2], "\"extra\": only in B");
  CompareOptions few;
  few.max_listed = 1;
  EXPECT_EQ(compare_checkpoints(path("a.pt"), path("b.safetensors"), few).differences.size(), 1u);
}

TEST_F(ConvertTest, InspectReadsHeadersAndReportsProblems) {
  StateDict sd = moe_state_dict(kModules, ExpertLayout::Single);
  save_safetensors(path("m.safetensors"), sd, {{"a", "b"}});
  CheckpointSummary s = inspect_checkpoint(path("m.safetensors"));
  EXPECT_EQ(s.format, CheckpointFormat::Safetensors);
  EXPECT_EQ(s.tensors.size(), sd.size());
  EXPECT_EQ(s.metadata.at("a"), "b");
  EXPECT_EQ(s.scan.modules.size(), 3u);
  sd.insert("model.layers.3.mlp.experts.weight0", Tensor::zeros({3, 5}, DType::BF16));
  save_pt(path("both.pt"), sd);
  s = inspect_checkpoint(path("both.pt"));
  ASSERT_EQ(s.scan.problems.size(), 1u);
  EXPECT_EQ(s.scan.problems[0].code(), ErrorCode::BothLayoutsPresent);
}

TEST_F(ConvertTest, ZipWriterTakesTheCallersCrc) {
  auto out = AtomicFile::create(path("a.zip"));
  zip::ZipWriter z(*out);
  z.begin_record("arc/x", 10);
  z.write_without_crc(std::as_bytes(std::span("234567", 6)));
  EXPECT_THROW(z.write_without_crc(std::as_bytes(std::span("012345", 5))), Error);  // too many
  z.write(std::as_bytes(std::span("wxyz", 4)));
  try {
    z.end_record();  // the writer did not see every byte: it cannot know the CRC
    FAIL() << "closed without a CRC";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
  }
  const std::string record = "234567wxyz";
  z.end_record(zip::crc32(0, std::as_bytes(std::span(record.data(), record.size()))));
  z.finish();
  out->commit();
  const std::string file = read_all(path("a.zip"));
  auto storage = Storage::allocate(file.size());
  std::memcpy(storage->mutable_data(), file.data(), file.size());
  const zip::ZipReader reader = zip::ZipReader::open(storage);
  const zip::Entry* e = reader.find("arc/x");
  ASSERT_NE(e, nullptr);
  reader.check_crc(*e);
  auto got = reader.bytes(*e);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(got.data()), got.size()), record);
}

// The record offsets PtArchive announces before writing are where the data land.
TEST_F(ConvertTest, PtArchiveKnowsItsRecordOffsets) {
  const std::vector<detail::PtTensorSpec> tensors = {{"a", DType::F32, {3}, 0, 0},
                                                     {"b.c", DType::BF16, {2, 5}, 1, 0},
                                                     {"d", DType::U8, {0}, 2, 0}};
  const std::vector<detail::PtRecordSpec> records = {{"0", 12}, {"1", 20}, {"2", 0}};
  auto out = AtomicFile::create(path("a.pt"));
  out->write(std::as_bytes(std::span("xyz", 3)));  // not at 0: the layout must follow
  const detail::PtArchive archive(tensors, records, 3, "writing test.pt");
  archive.write(*out, [&](size_t i, zip::ZipWriter& z) -> std::optional<uint32_t> {
    z.write(std::vector<std::byte>(records[i].nbytes, std::byte{7}));
    return std::nullopt;
  });
  out->commit();
  const std::string file = read_all(path("a.pt"));
  auto storage = Storage::allocate(file.size());
  std::memcpy(storage->mutable_data(), file.data(), file.size());
  EXPECT_THROW(archive.write(*AtomicFile::create(path("b.pt")), {}), Error);  // at 0, not 3
  const zip::ZipReader reader = zip::ZipReader::open(storage);
  for (size_t i = 0; i < records.size(); ++i) {
    const zip::Entry* e = reader.find("archive/data/" + records[i].key);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->data_offset, archive.record_data_offset(i)) << i;
  }
}

// A bit-at-a-time CRC-32, the definition the fast versions must match.
uint32_t crc32_bitwise(uint32_t crc, const std::byte* p, size_t n) {
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) {
    crc ^= std::to_integer<uint32_t>(p[i]);
    for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0xEDB88320u : crc >> 1;
  }
  return ~crc;
}

// zip::crc32 (libdeflate, or the portable tables) at every alignment and length around the
// 64-byte folds a fast CRC works in, from any start.
TEST(Crc32, MatchesTheDefinition) {
  std::vector<std::byte> data(5000);
  std::mt19937 rng(3);
  for (std::byte& b : data) b = static_cast<std::byte>(rng());
  for (size_t offset : {0, 1, 7, 13}) {
    for (size_t n = 0; n < 1200; n += (n < 300 ? 1 : 37)) {
      for (uint32_t start : {0u, 0xDEADBEEFu}) {
        const std::span<const std::byte> s(data.data() + offset, n);
        const uint32_t want = crc32_bitwise(start, s.data(), s.size());
        ASSERT_EQ(zip::crc32(start, s), want) << "offset " << offset << " n " << n;
      }
    }
  }
}

}  // namespace
}  // namespace grouplin
