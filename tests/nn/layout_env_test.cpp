// Weight layouts: choosing one (option, NVTE_ALLOC_CONTIGUOUS_GROUPED_LINEAR_WEIGHTS fallback,
// accepted spellings, clear errors) and what each layout looks like: parameters, gradients and
// state-dict keys. Every test that touches the environment goes through ScopedEnv, which puts
// the previous value back however the scope is left.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "grouplin/error.hpp"
#include "grouplin/grouped_linear.hpp"

namespace grouplin {
namespace {

// Sets (or unsets, with nullopt) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, std::optional<std::string> value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) previous_ = old;
    apply(value);
  }
  ~ScopedEnv() { apply(previous_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void apply(const std::optional<std::string>& value) {
    if (value) {
      setenv(name_.c_str(), value->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  std::string name_;
  std::optional<std::string> previous_;
};

std::optional<std::string> current(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::optional<std::string>(v) : std::nullopt;
}

TEST(ScopedEnvTest, RestoresPreviousValueOrAbsenceEvenOnException) {
  const char* name = "GROUPLIN_TEST_SCOPED_ENV";
  {
    ScopedEnv outer(name, std::nullopt);
    {
      ScopedEnv inner(name, "x");
      EXPECT_EQ(current(name), "x");
    }
    EXPECT_EQ(current(name), std::nullopt);
    ScopedEnv set(name, "before");
    try {
      ScopedEnv inner(name, "during");
      EXPECT_EQ(current(name), "during");
      throw std::runtime_error("leaving the scope by an exception");
    } catch (const std::runtime_error&) {
    }
    EXPECT_EQ(current(name), "before");
    {
      ScopedEnv unset(name, std::nullopt);
      EXPECT_EQ(current(name), std::nullopt);
    }
    EXPECT_EQ(current(name), "before");
  }
  EXPECT_EQ(current(name), std::nullopt);
}

TEST(ResolveLayoutTest, UnsetVariableMeansPerExpert) {
  ScopedEnv env(kContiguousWeightsEnv, std::nullopt);
  EXPECT_EQ(resolve_weight_layout(std::nullopt), WeightLayout::PerExpert);
}

TEST(ResolveLayoutTest, AcceptedSpellingsInAnyCase) {
  const std::vector<std::string> truthy = {"1", "true", "TRUE", "True", "yes", "YeS", "on", "ON"};
  const std::vector<std::string> falsy = {"", "0", "false", "FALSE", "no", "No", "off", "oFF"};
  for (const auto& v : truthy) {
    ScopedEnv env(kContiguousWeightsEnv, v);
    EXPECT_EQ(resolve_weight_layout(std::nullopt), WeightLayout::Contiguous) << '"' << v << '"';
  }
  for (const auto& v : falsy) {
    ScopedEnv env(kContiguousWeightsEnv, v);
    EXPECT_EQ(resolve_weight_layout(std::nullopt), WeightLayout::PerExpert) << '"' << v << '"';
  }
}

TEST(ResolveLayoutTest, AnythingElseIsAnErrorNamingVariableValueAndAcceptedValues) {
  for (const std::string v : {"2", "-1", "truee", "y", "n", " 1", "1 ", "enable", "contiguous"}) {
    ScopedEnv env(kContiguousWeightsEnv, v);
    try {
      resolve_weight_layout(std::nullopt);
      ADD_FAILURE() << "accepted \"" << v << '"';
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidEnvironment) << e.what();
      const std::string m = e.message();
      EXPECT_NE(m.find(kContiguousWeightsEnv), std::string::npos) << m;
      EXPECT_NE(m.find('"' + v + '"'), std::string::npos) << m;
      for (const char* accepted : {"1", "true", "yes", "on", "0", "false", "no", "off", "empty"}) {
        EXPECT_NE(m.find(accepted), std::string::npos) << accepted << " missing from: " << m;
      }
    }
    // The constructor reports the same error and builds nothing.
    GroupedLinearOptions o;
    try {
      GroupedLinear layer(o);
      ADD_FAILURE() << "constructed with \"" << v << '"';
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidEnvironment) << e.what();
    }
  }
}

TEST(ResolveLayoutTest, ExplicitOptionWinsOverAnyEnvironment) {
  for (const char* v : {"1", "0", "garbage"}) {
    ScopedEnv env(kContiguousWeightsEnv, std::string(v));
    for (WeightLayout layout :
         {WeightLayout::PerExpert, WeightLayout::Contiguous, WeightLayout::Single}) {
      EXPECT_EQ(resolve_weight_layout(layout), layout) << v;
      GroupedLinearOptions o;
      o.num_gemms = 2;
      o.weight_layout = layout;
      EXPECT_EQ(GroupedLinear(o).layout(), layout) << v;
    }
  }
}

TEST(ResolveLayoutTest, ConstructorFollowsTheEnvironmentWhenNoOptionIsGiven) {
  GroupedLinearOptions o;
  o.num_gemms = 3;
  {
    ScopedEnv env(kContiguousWeightsEnv, "Yes");
    GroupedLinear layer(o);
    EXPECT_EQ(layer.layout(), WeightLayout::Contiguous);
    // Really contiguous: every weight views one storage.
    EXPECT_EQ(layer.expert_weight(0).storage(), layer.expert_weight(2).storage());
  }
  {
    ScopedEnv env(kContiguousWeightsEnv, "off");
    EXPECT_EQ(GroupedLinear(o).layout(), WeightLayout::PerExpert);
  }
  {
    ScopedEnv env(kContiguousWeightsEnv, std::nullopt);
    EXPECT_EQ(GroupedLinear(o).layout(), WeightLayout::PerExpert);
  }
}

TEST(LayoutTest, Names) {
  EXPECT_EQ(layout_name(WeightLayout::PerExpert), "per-expert");
  EXPECT_EQ(layout_name(WeightLayout::Contiguous), "contiguous");
  EXPECT_EQ(layout_name(WeightLayout::Single), "single");
}

// A layer with gradients allocated by one backward pass.
GroupedLinearOptions grad_options(WeightLayout layout, DType dtype, bool fused) {
  GroupedLinearOptions o;
  o.num_gemms = 4;
  o.in_features = 5;  // 3 x 5 F32 = 60 bytes: members need padding to stay aligned
  o.out_features = 3;
  o.params_dtype = dtype;
  o.weight_layout = layout;
  o.fuse_wgrad_accumulation = fused;
  return o;
}

void run_backward(GroupedLinear& layer) {
  const DType dt = layer.options().params_dtype;
  layer.forward(Tensor::zeros({6, 5}, dt), std::vector<int64_t>{1, 2, 0, 3});
  layer.backward(Tensor::zeros({6, 3}, dt));
}

std::vector<std::string> keys_of(const GroupedLinear& layer) { return layer.state_dict().keys(); }

TEST(LayoutTest, SingleHoldsOneStackedWeightBiasAndGrad) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    GroupedLinear layer(grad_options(WeightLayout::Single, dtype, false));
    ASSERT_EQ(layer.parameters().size(), 2u);
    EXPECT_EQ(keys_of(layer), (std::vector<std::string>{"weight", "bias", "_extra_state"}));
    const Parameter& w = layer.parameters()[0];
    const Parameter& b = layer.parameters()[1];
    EXPECT_EQ(w.value.shape(), (Shape{4, 3, 5}));
    EXPECT_EQ(b.value.shape(), (Shape{4, 3}));
    run_backward(layer);
    EXPECT_EQ(w.grad.shape(), (Shape{4, 3, 5}));
    EXPECT_EQ(w.grad.dtype(), dtype);
    EXPECT_EQ(b.grad.shape(), (Shape{4, 3}));
    for (int64_t i = 0; i < 4; ++i) {
      EXPECT_TRUE(layer.expert_weight(i).same_view(w.value.select(i)));
      EXPECT_TRUE(layer.expert_weight_grad(i).same_view(w.grad.select(i)));
      EXPECT_TRUE(layer.expert_bias_grad(i).same_view(b.grad.select(i)));
    }
  }
}

// Every tensor views `storage`, at 64-byte-aligned offsets, without overlapping another.
void expect_one_aligned_group(const std::vector<Tensor>& ts) {
  ASSERT_FALSE(ts.empty());
  std::set<size_t> offsets;
  for (const Tensor& t : ts) {
    EXPECT_EQ(t.storage(), ts[0].storage());
    EXPECT_EQ(t.storage_offset() % 64, 0u);
    EXPECT_TRUE(offsets.insert(t.storage_offset()).second) << "two members at one offset";
  }
}

TEST(LayoutTest, ContiguousParametersAndGradsAreViewsOfOneAllocationEach) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (bool fused : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (fused ? " fused" : ""));
      GroupedLinear layer(grad_options(WeightLayout::Contiguous, dtype, fused));
      EXPECT_EQ(keys_of(layer),
                (std::vector<std::string>{"weight0", "weight1", "weight2", "weight3", "bias0",
                                          "bias1", "bias2", "bias3", "_extra_state"}));
      run_backward(layer);
      std::vector<Tensor> w, b, wg, bg;
      for (int64_t i = 0; i < 4; ++i) {
        w.push_back(layer.expert_weight(i));
        b.push_back(layer.expert_bias(i));
        wg.push_back(fused ? layer.expert_main_grad(i) : layer.expert_weight_grad(i));
        bg.push_back(layer.expert_bias_grad(i));
        EXPECT_EQ(wg.back().dtype(), fused ? DType::F32 : dtype);
        EXPECT_EQ(wg.back().shape(), (Shape{3, 5}));
      }
      expect_one_aligned_group(w);
      expect_one_aligned_group(b);
      expect_one_aligned_group(wg);
      expect_one_aligned_group(bg);
      const std::set<const Storage*> distinct = {w[0].storage().get(), b[0].storage().get(),
                                                 wg[0].storage().get(), bg[0].storage().get()};
      EXPECT_EQ(distinct.size(), 4u);
    }
  }
}

TEST(LayoutTest, PerExpertParametersAndGradsAreSeparateAllocations) {
  GroupedLinear layer(grad_options(WeightLayout::PerExpert, DType::F32, true));
  EXPECT_EQ(keys_of(layer).front(), "weight0");
  run_backward(layer);
  std::set<const Storage*> storages;
  for (int64_t i = 0; i < 4; ++i) {
    for (const Tensor& t : {layer.expert_weight(i), layer.expert_bias(i), layer.expert_main_grad(i),
                            layer.expert_bias_grad(i)}) {
      ASSERT_TRUE(t.defined());
      EXPECT_TRUE(storages.insert(t.storage().get()).second);
    }
    EXPECT_EQ(layer.expert_main_grad(i).dtype(), DType::F32);
  }
}

}  // namespace
}  // namespace grouplin
