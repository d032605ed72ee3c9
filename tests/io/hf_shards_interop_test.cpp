// GroupLin's directory conversion against the reference `safetensors` package and torch
// (tests/io/hf_shards_peer.py): Hugging Face-style sharded checkpoints written by the reference,
// Qwen and Mixtral names, experts split across shards, with and without an index, converted to
// fused experts (bit-identical to torch.stack/torch.cat as transformers 5 fuses them, the index as
// transformers writes it, shards as the reference writes them) and back (the original tensors).
#include <gtest/gtest.h>

#include <string>

#include "grouplin/convert.hpp"
#include "io/python_peer.hpp"
#include "temp_dir_test.hpp"

namespace grouplin {
namespace {

class HfShardsInterop : public test_files::TempDirTest {
 protected:
  HfShardsInterop() : TempDirTest("grouplin_hf_shards") {}
  void peer(const std::string& args) {
    std::string output;
    ASSERT_EQ(test_io::run_python_peer("tests/io/hf_shards_peer.py", args, output), 0) << output;
  }
};

// The peer runs twice in all (each start imports torch): it writes every case, GroupLin converts
// them, the peer checks them.
TEST_F(HfShardsInterop, ReferenceShardsConvertToWhatTransformersFusesAndBack) {
  ASSERT_NO_FATAL_FAILURE(peer("make " + dir_.string()));
  for (const char* c : {"qwen", "qwen-noindex", "mixtral", "mixtral-noindex"}) {
    SCOPED_TRACE(c);
    const std::string hf = path(std::string(c) + "/hf");
    const std::string fused = path(std::string(c) + "/fused");
    ConvertOptions o;
    o.layout = ExpertLayout::Single;
    o.max_shard_size = 1500;  // several shards, the fused tensors among them
    convert_checkpoint(hf, fused, o);
    o.layout = ExpertLayout::PerExpert;
    convert_checkpoint(fused, path(std::string(c) + "/back"), o);
  }
  peer("check " + dir_.string());
}

TEST_F(HfShardsInterop, APeerFailureIsReported) {
  std::string output;
  EXPECT_NE(test_io::run_python_peer("tests/io/hf_shards_peer.py", "check " + path("none"), output),
            0);
}

}  // namespace
}  // namespace grouplin
