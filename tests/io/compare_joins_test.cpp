// verify under a family's joins: tensors that are not experts which one form stores whole and the
// other in parts along their first dim (sarvam_moe's query_key_value vs q/k/v_proj), or
// transposed (ergo's router and shared expert).
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "grouplin/compare.hpp"
#include "grouplin/error.hpp"
#include "grouplin/layout_rules.hpp"
#include "grouplin/safetensors.hpp"
#include "io/moe_checkpoint.hpp"
#include "temp_dir_test.hpp"

namespace grouplin {
namespace {

using testing::pattern_tensor;

// Rows [begin, end) of a rank-2 tensor, as a tensor of its own.
Tensor rows(const Tensor& t, int64_t begin, int64_t end) {
  const int64_t cols = t.shape()[1];
  Tensor out = Tensor::zeros({end - begin, cols}, t.dtype());
  const size_t row_bytes = static_cast<size_t>(cols) * dtype_size(t.dtype());
  std::memcpy(out.mutable_data(), static_cast<const std::byte*>(t.data()) + begin * row_bytes,
              static_cast<size_t>(end - begin) * row_bytes);
  return out;
}

class CompareJoinsTest : public test_files::TempDirTest {
 protected:
  CompareJoinsTest() : TempDirTest("grouplin_compare_joins") {}

  // The Hub form (query_key_value [8, 4], under ".attention.") and the v5 form (q [4, 4], k and
  // v [2, 4], under ".self_attn.") of one sarvam_moe attention, with `edit` applied to v5's.
  template <typename Edit>
  void write_forms(Edit edit) {
    const Tensor qkv = pattern_tensor({8, 4}, DType::F32, 3);
    const Tensor embed = pattern_tensor({6, 4}, DType::F32, 4);
    // A grouped module of the family: its renames apply where one of its modules is.
    StateDict hub = testing::hf_state_dict({}, false), v5 = testing::hf_state_dict({}, true);
    hub.erase("model.embed_tokens.weight");  // sarvam_moe's Hub name is word_embeddings
    v5.erase("model.embed_tokens.weight");
    hub.insert("model.layers.5.attention.query_key_value.weight", qkv);
    hub.insert("model.word_embeddings.weight", embed);
    v5.insert("model.layers.5.self_attn.q_proj.weight", rows(qkv, 0, 4));
    v5.insert("model.layers.5.self_attn.k_proj.weight", rows(qkv, 4, 6));
    v5.insert("model.layers.5.self_attn.v_proj.weight", rows(qkv, 6, 8));
    v5.insert("model.embed_tokens.weight", embed);
    edit(v5);
    save_safetensors(path("hub.safetensors"), hub);
    save_safetensors(path("v5.safetensors"), v5);
  }

  static CompareOptions sarvam() {
    CompareOptions o;
    o.model_type = "sarvam_moe";
    return o;
  }
};

TEST_F(CompareJoinsTest, PartsCompareWithTheirWholeBothWays) {
  write_forms([](StateDict&) {});
  for (const bool hub_first : {true, false}) {
    const std::string a = path(hub_first ? "hub.safetensors" : "v5.safetensors");
    const std::string b = path(hub_first ? "v5.safetensors" : "hub.safetensors");
    const CompareReport r = compare_checkpoints(a, b, sarvam());
    EXPECT_TRUE(r.same) << (r.differences.empty() ? "" : r.differences[0]);
    // The whole counts once, with all its bytes: as comparing the Hub form with itself.
    const CompareReport self =
        compare_checkpoints(path("hub.safetensors"), path("hub.safetensors"), sarvam());
    EXPECT_EQ(r.tensors_compared, self.tensors_compared);
    EXPECT_EQ(r.bytes_compared, self.bytes_compared);
  }
}

TEST_F(CompareJoinsTest, ADifferenceInAPartIsFoundAtItsRowOfTheWhole) {
  write_forms([](StateDict& v5) {
    Tensor k = v5.at("model.layers.5.self_attn.k_proj.weight").clone();
    k.mutable_data_as<float>()[5] = 42.0f;  // k's [1, 1]: the whole's [5, 1]
    v5.set("model.layers.5.self_attn.k_proj.weight", k);
  });
  const CompareReport r =
      compare_checkpoints(path("hub.safetensors"), path("v5.safetensors"), sarvam());
  EXPECT_FALSE(r.same);
  ASSERT_EQ(r.differences.size(), 1u);
  EXPECT_EQ(r.differences[0].rfind("\"model.layers.5.attention.query_key_value.weight\" (A; "
                                   "joined from \"model.layers.5.attention.q_proj.weight\", ",
                                   0),
            0u)
      << r.differences[0];
  EXPECT_NE(r.differences[0].find("1 of 32 elements differ, first at [5, 1]: "), std::string::npos)
      << r.differences[0];
  EXPECT_NE(r.differences[0].find("vs 42"), std::string::npos) << r.differences[0];
}

TEST_F(CompareJoinsTest, PartsOfOtherShapesAreADifference) {
  write_forms([](StateDict& v5) {
    v5.set("model.layers.5.self_attn.v_proj.weight", pattern_tensor({3, 4}, DType::F32, 5));
  });
  const CompareReport r =
      compare_checkpoints(path("hub.safetensors"), path("v5.safetensors"), sarvam());
  ASSERT_EQ(r.differences.size(), 1u);
  EXPECT_NE(r.differences[0].find("shape [8, 4] F32 vs [4, 4] + [2, 4] + [3, 4] F32 + F32 + F32"),
            std::string::npos)
      << r.differences[0];
}

TEST_F(CompareJoinsTest, APartMissingLeavesEveryNameUnmatched) {
  write_forms([](StateDict& v5) { v5.erase("model.layers.5.self_attn.v_proj.weight"); });
  const CompareReport r =
      compare_checkpoints(path("hub.safetensors"), path("v5.safetensors"), sarvam());
  EXPECT_EQ(r.differing, 3u);  // the whole only in A, q and k only in B
  EXPECT_EQ(r.differences.at(0), "\"model.layers.5.attention.query_key_value.weight\": only in A");
  EXPECT_EQ(r.differences.at(1), "\"model.layers.5.attention.k_proj.weight\": only in B");
}

// Joins come from the rules: a family without them, or none at all, compares names only; a rule
// file may declare its own.
TEST_F(CompareJoinsTest, JoinsComeFromTheRules) {
  write_forms([](StateDict&) {});
  CompareOptions plain;
  plain.model_type = "qwen3_moe";
  EXPECT_EQ(compare_checkpoints(path("hub.safetensors"), path("v5.safetensors"), plain).differing,
            6u);  // query_key_value and word_embeddings only in A, 4 names only in B
  // The hf structure as a rule file, with sarvam_moe's renames and join written in.
  nlohmann::json file = nlohmann::json::parse(rules_to_json(builtin_rules("hf")));
  file["name"] = "own";
  file["renames"] = nlohmann::json::parse(R"([{"from": ".attention.", "to": ".self_attn."},
      {"from": "^model.word_embeddings.", "to": "model.embed_tokens."}])");
  file["joins"] = nlohmann::json::parse(
      R"([{"whole": "query_key_value", "parts": ["q_proj", "k_proj", "v_proj"]}])");
  CompareOptions own;
  own.rules = {parse_rules(file.dump(), "own rules")};
  const CompareReport r = compare_checkpoints(path("v5.safetensors"), path("hub.safetensors"), own);
  EXPECT_TRUE(r.same) << (r.differences.empty() ? "" : r.differences[0]);
}

// Ergo stores its router and shared expert [in, out] on the Hub, transformers v5 [out, in]
// (Transpose(0, 1)): verify compares each with its transpose.
class CompareTransposedJoinsTest : public test_files::TempDirTest {
 protected:
  CompareTransposedJoinsTest() : TempDirTest("grouplin_compare_transposed_joins") {}

  static Tensor transposed(const Tensor& t) {
    const int64_t rows = t.shape()[0], cols = t.shape()[1];
    Tensor out = Tensor::zeros({cols, rows}, t.dtype());
    const float* src = t.data_as<float>();
    float* dst = out.mutable_data_as<float>();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
    }
    return out;
  }

  // One Ergo MoE layer in both forms, with `edit` applied to v5's.
  template <typename Edit>
  void write_forms(Edit edit) {
    const Tensor up = pattern_tensor({3, 6, 4}, DType::F32, 1),
                 down = pattern_tensor({3, 4, 6}, DType::F32, 2);
    const Tensor router = pattern_tensor({6, 3}, DType::F32, 3),
                 shared_up = pattern_tensor({6, 5}, DType::F32, 4);
    StateDict hub, v5;
    hub.insert("layers.1.feed_forward.up_proj", up);
    hub.insert("layers.1.feed_forward.down_proj", down);
    hub.insert("layers.1.feed_forward.gate_kernel", router);
    hub.insert("layers.1.feed_forward.shared_up_proj", shared_up);
    v5.insert("model.layers.1.mlp.experts.up_proj", up);
    v5.insert("model.layers.1.mlp.experts.down_proj", down);
    v5.insert("model.layers.1.mlp.gate.linear.weight", transposed(router));
    v5.insert("model.layers.1.mlp.shared_experts.up_proj.weight", transposed(shared_up));
    edit(v5);
    save_safetensors(path("hub.safetensors"), hub);
    save_safetensors(path("v5.safetensors"), v5);
  }

  static CompareOptions ergo() {
    CompareOptions o;
    o.model_type = "ergo";
    return o;
  }
};

TEST_F(CompareTransposedJoinsTest, EachComparesWithItsTransposeBothWays) {
  write_forms([](StateDict&) {});
  for (const bool hub_first : {true, false}) {
    const std::string a = path(hub_first ? "hub.safetensors" : "v5.safetensors");
    const std::string b = path(hub_first ? "v5.safetensors" : "hub.safetensors");
    const CompareReport r = compare_checkpoints(a, b, ergo());
    EXPECT_TRUE(r.same) << (r.differences.empty() ? "" : r.differences[0]);
    EXPECT_EQ(r.tensors_compared, 4u);
    const CompareReport self =
        compare_checkpoints(path("hub.safetensors"), path("hub.safetensors"), ergo());
    EXPECT_EQ(r.bytes_compared, self.bytes_compared);
  }
}

TEST_F(CompareTransposedJoinsTest, ADifferenceIsFoundAtItsPlaceInTheWhole) {
  write_forms([](StateDict& v5) {
    Tensor w = v5.at("model.layers.1.mlp.gate.linear.weight").clone();  // [3, 6]
    w.mutable_data_as<float>()[1 * 6 + 4] = 42.0f;
    v5.set("model.layers.1.mlp.gate.linear.weight", w);
  });
  const CompareReport r =
      compare_checkpoints(path("hub.safetensors"), path("v5.safetensors"), ergo());
  ASSERT_EQ(r.differences.size(), 1u);
  EXPECT_EQ(r.differences[0].rfind("\"model.layers.1.mlp.gate.linear.weight\" (B; transposed "
                                   "from \"model.layers.1.feed_forward.gate_kernel\" of A)",
                                   0),
            0u)
      << r.differences[0];
  EXPECT_NE(r.differences[0].find("1 of 18 elements differ, first at [1, 4]: "), std::string::npos)
      << r.differences[0];
}

TEST_F(CompareTransposedJoinsTest, APartNotTransposedIsADifference) {
  write_forms([](StateDict& v5) {  // stored as the Hub stores it: [6, 5], not [5, 6]
    v5.set("model.layers.1.mlp.shared_experts.up_proj.weight",
           pattern_tensor({6, 5}, DType::F32, 4));
  });
  const CompareReport r =
      compare_checkpoints(path("hub.safetensors"), path("v5.safetensors"), ergo());
  ASSERT_EQ(r.differences.size(), 1u);
  EXPECT_NE(r.differences[0].find("shape [6, 5] F32 vs [6, 5] F32 transposed"), std::string::npos)
      << r.differences[0];
}

TEST(RuleFileJoins, ATransposedJoinHasOnePartAndSurvivesTheJsonForm) {
  nlohmann::json file = nlohmann::json::parse(rules_to_json(builtin_rules("ergo")));
  EXPECT_EQ(file["joins"][0]["transposed"], true);
  const LayoutRules back = parse_rules(file.dump(), "ergo as a file");
  ASSERT_EQ(back.joins.size(), 3u);
  EXPECT_TRUE(back.joins[0].transposed);
  file["joins"][0]["parts"].push_back("feed_forward.other");
  try {
    parse_rules(file.dump(), "two parts");
    ADD_FAILURE() << "a transposed join of two parts was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidRules);
    EXPECT_NE(std::string(e.what()).find("a transposed one exactly one"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace grouplin
