// The whole use of GroupLin's grouped layer in one page: build, forward, backward, a training
// step, and moving the weights into a module of another layout through a state dict.
#include <cstdio>
#include <vector>

#include "grouplin/grouplin.hpp"

int main() {
  using namespace grouplin;
  try {
    // Four experts mapping 16 features to 8, stored as one [4, 8, 16] weight.
    GroupedLinearOptions options;
    options.num_gemms = 4;
    options.in_features = 16;
    options.out_features = 8;
    options.weight_layout = WeightLayout::Single;
    options.seed = 42;
    GroupedLinear layer(options);

    // Ten tokens routed 3 / 0 / 5 / 2 to the experts; expert 1 gets none.
    std::vector<float> values(10 * 16);
    for (size_t i = 0; i < values.size(); ++i) values[i] = 0.01f * static_cast<float>(i % 17);
    const Tensor x = Tensor::from_f32({10, 16}, values);
    const std::vector<int64_t> m_splits = {3, 0, 5, 2};
    const Tensor y = layer.forward(x, m_splits);  // [10, 8]

    // Backward with dy = 1 fills the weight and bias gradients; then one SGD step.
    const Tensor dy = Tensor::from_f32({10, 8}, std::vector<float>(80, 1.0f));
    const Tensor dx = layer.backward(dy);  // [10, 16]
    std::printf("y %s, dx %s, weight grad %s\n", shape_to_string(y.shape()).c_str(),
                shape_to_string(dx.shape()).c_str(),
                shape_to_string(layer.parameter("weight").grad.shape()).c_str());
    sgd_step(layer, 0.1f);

    // The same weights in the per-expert layout: keys weight0..3 / bias0..3 are filled from
    // the stacked weight [4, 8, 16] through views, without a split copy.
    options.weight_layout = WeightLayout::PerExpert;
    GroupedLinear per_expert(options);
    LoadReport report = per_expert.load_state_dict(layer.state_dict());
    const bool same = per_expert.forward(x, m_splits).bit_equal(layer.forward(x, m_splits));
    std::printf("loaded %zu keys, converted from %s to %s, outputs %s\n", report.loaded.size(),
                layout_name(report.layout_conversions.at(0).from).data(),
                layout_name(report.layout_conversions.at(0).to).data(),
                same ? "bit-identical" : "DIFFERENT");
    return same ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
