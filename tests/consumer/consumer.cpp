// An outside program built against the installed GroupLin package only (tests/consumer): it
// trains a small grouped layer, saves and reloads it through a file in another layout, reads a
// failed load's problems as data, and prints the library's version for the CI step to compare
// with `grouplin --version`.
//
//   consumer DIR        runs the checks, writing in DIR; prints "consumer: ok"
//   consumer --version  prints grouplin::version()
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "grouplin/grouplin.hpp"

namespace {

int fail(const std::string& what) {
  std::fprintf(stderr, "consumer: FAILED: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--version") == 0) {
    std::printf("%s\n", std::string(grouplin::version()).c_str());
    return 0;
  }
  if (argc != 2) return fail("usage: consumer DIR | --version");
  const std::string dir = argv[1];
  try {
    grouplin::set_num_threads(2);
    grouplin::GroupedLinear layer({.num_gemms = 4,
                                   .in_features = 16,
                                   .out_features = 8,
                                   .weight_layout = grouplin::WeightLayout::PerExpert});
    const std::vector<int64_t> m_splits = {3, 0, 2, 5};
    std::vector<float> x_buf(10 * 16, 0.25f);
    const grouplin::Tensor x =
        grouplin::Tensor::from_blob(x_buf.data(), {10, 16}, grouplin::DType::F32);
    grouplin::Tensor y = grouplin::Tensor::zeros({10, 8}, grouplin::DType::F32);
    grouplin::Tensor dx = grouplin::Tensor::zeros({10, 16}, grouplin::DType::F32);
    layer.forward(x, m_splits, y);
    layer.backward(y, dx);
    grouplin::sgd_step(layer, 0.1f);

    // Through a file, into the other layout, bit for bit.
    const std::string path = dir + "/consumer.safetensors";
    grouplin::save_checkpoint(path, layer.state_dict());
    grouplin::GroupedLinear single({.num_gemms = 4,
                                    .in_features = 16,
                                    .out_features = 8,
                                    .weight_layout = grouplin::WeightLayout::Single,
                                    .seed = 9});
    const grouplin::LoadReport r = single.load_state_dict(grouplin::load_checkpoint(path).tensors);
    if (r.layout_conversions.size() != 1) return fail("no layout conversion reported");
    if (!single.forward(x, m_splits).bit_equal(layer.forward(x, m_splits))) {
      return fail("outputs differ after the layout change");
    }

    // A failed load: problems as data, nothing changed.
    grouplin::StateDict partial = layer.state_dict();
    partial.erase("weight2");
    try {
      single.load_state_dict(partial);
      return fail("a partial expert set was accepted");
    } catch (const grouplin::Error& e) {
      if (e.code() != grouplin::ErrorCode::PartialExpertSet || e.problems().empty() ||
          e.problems()[0].key != "weight2") {
        return fail(std::string("unexpected error: ") + e.what());
      }
    }
    std::printf("consumer: ok (GroupLin %s)\n", std::string(grouplin::version()).c_str());
    return 0;
  } catch (const grouplin::Error& e) {
    return fail(e.what());
  }
}
