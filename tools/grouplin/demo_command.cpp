// grouplin demo: the main job on a small embedded example. Trains a small MoE layer with SGD on
// generated data, moves its state dict into a module of another layout nested under another
// parent, and checks the outputs are bit-identical.
#include <stdlib.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <vector>

#include "cli/commands.hpp"
#include "grouplin/grouplin.hpp"

namespace grouplin::cli {
namespace {

struct DemoConfig {
  int64_t experts = 8;
  int64_t in_features = 64;
  int64_t out_features = 32;
  int64_t rows = 256;
  int steps = 8;
  float lr = 4.0f;
  uint64_t seed = 1;
  std::string out_dir;  // where the checkpoint files go; empty: a temporary folder, removed after
};

std::string make_temp_dir() {
  std::string templ = (std::filesystem::temp_directory_path() / "grouplin-demo-XXXXXX").string();
  if (mkdtemp(templ.data()) == nullptr) {
    throw Error(ErrorCode::IoError, "demo: cannot create a temporary folder from " + templ);
  }
  return templ;
}

Tensor random_tensor(const Shape& shape, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (float& f : v) f = dist(rng);
  return Tensor::from_f32(shape, v);
}

// Skewed routing: expert i gets a share proportional to (i + 1), expert 2 gets none.
std::vector<int64_t> make_splits(int64_t experts, int64_t rows) {
  std::vector<int64_t> splits(static_cast<size_t>(experts), 0);
  int64_t weight_sum = 0;
  for (int64_t i = 0; i < experts; ++i) weight_sum += (i == 2 ? 0 : i + 1);
  int64_t assigned = 0;
  for (int64_t i = 0; i < experts; ++i) {
    splits[static_cast<size_t>(i)] = i == 2 ? 0 : rows * (i + 1) / weight_sum;
    assigned += splits[static_cast<size_t>(i)];
  }
  splits.back() += rows - assigned;
  return splits;
}

// Mean squared error between y and target, and its gradient 2 (y - t) / numel.
double mse(const Tensor& y, const Tensor& target, Tensor& dy) {
  const float* a = y.data_as<float>();
  const float* b = target.data_as<float>();
  float* g = dy.mutable_data_as<float>();
  const auto n = static_cast<size_t>(y.numel());
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const float d = a[i] - b[i];
    sum += static_cast<double>(d) * d;
    g[i] = 2.0f * d / static_cast<float>(n);
  }
  return sum / static_cast<double>(n);
}

void run_demo(const DemoConfig& c) {
  std::printf("GroupLin demo: a grouped linear layer of %lld experts, %lld -> %lld features\n",
              static_cast<long long>(c.experts), static_cast<long long>(c.in_features),
              static_cast<long long>(c.out_features));
  std::mt19937_64 rng(c.seed);
  const std::vector<int64_t> splits = make_splits(c.experts, c.rows);
  std::printf("routing of %lld rows (expert 2 gets none):", static_cast<long long>(c.rows));
  for (int64_t m : splits) std::printf(" %lld", static_cast<long long>(m));
  std::printf("\n");

  // The task: imitate a teacher layer with other weights.
  GroupedLinearOptions o;
  o.num_gemms = c.experts;
  o.in_features = c.in_features;
  o.out_features = c.out_features;
  o.weight_layout = WeightLayout::PerExpert;
  o.seed = c.seed;
  GroupedLinearOptions teacher_options = o;
  teacher_options.seed = c.seed + 100;
  GroupedLinear teacher(teacher_options);
  const Tensor x = random_tensor({c.rows, c.in_features}, rng);
  const Tensor target = teacher.forward(x, splits);

  // 1. Train the student, nested in a model, in the per-expert layout.
  auto model = std::make_shared<Sequential>();
  auto block = std::make_shared<Sequential>();
  auto student = std::make_shared<GroupedLinear>(o);
  block->add_child("fc1", student);
  model->add_child("experts", block);
  std::printf("\n1. training model.experts.fc1 (layout %s) with SGD, lr %.2f\n",
              std::string(layout_name(student->layout())).c_str(), c.lr);
  Tensor dy = Tensor::zeros({c.rows, c.out_features}, DType::F32);
  double first = 0, last = 0;
  for (int step = 0; step <= c.steps; ++step) {
    const Tensor y = student->forward(x, splits);
    last = mse(y, target, dy);
    if (step == 0) first = last;
    std::printf("   step %2d  loss %.6f\n", step, last);
    if (step == c.steps) break;
    student->backward(dy);
    sgd_step(*model, c.lr);
  }
  std::printf("   loss %.6f -> %.6f (%s)\n", first, last,
              last < first ? "going down" : "NOT going down");
  if (!(last < first))
    throw Error(ErrorCode::InvalidArgument, "demo: training did not reduce the loss");

  // 2. Move the weights into a Single-layout layer under another parent, through a state dict.
  const StateDict saved = model->state_dict();
  std::printf("\n2. state dict of the trained model: %zu entries (%s, ...)\n", saved.size(),
              saved.begin()->first.c_str());
  auto other = std::make_shared<Sequential>();
  auto layers = std::make_shared<Sequential>();
  GroupedLinearOptions single = o;
  single.weight_layout = WeightLayout::Single;
  single.seed = c.seed + 7;  // different initial weights, so the load must overwrite them
  auto reloaded = std::make_shared<GroupedLinear>(single);
  layers->add_child("fc1", reloaded);
  other->add_child("experts", layers);
  const LoadReport report = other->load_state_dict(saved);
  for (const auto& conv : report.layout_conversions) {
    std::printf("   loaded %zu keys; converted %s from %s to %s\n", report.loaded.size(),
                conv.module.c_str(), std::string(layout_name(conv.from)).c_str(),
                std::string(layout_name(conv.to)).c_str());
  }
  const Tensor y_trained = student->forward(x, splits);
  const Tensor y_reloaded = reloaded->forward(x, splits);
  const bool same = y_trained.bit_equal(y_reloaded);
  std::printf("   outputs of the per-expert and single layers: %s\n",
              same ? "bit-identical" : "DIFFERENT");
  if (!same)
    throw Error(ErrorCode::InvalidArgument, "demo: outputs differ after the layout change");

  // 3. Through real files: safetensors from the per-expert model, .pt from the single one.
  const std::string dir = c.out_dir.empty() ? make_temp_dir() : c.out_dir;
  const std::string st_path = dir + "/demo-per-expert.safetensors";
  const std::string pt_path = dir + "/demo-single.pt";
  save_checkpoint(st_path, saved, std::nullopt, {{"producer", "grouplin demo"}});
  save_checkpoint(pt_path, other->state_dict());
  std::printf("\n3. saved %s (per-expert keys) and %s (single-layout keys)\n", st_path.c_str(),
              pt_path.c_str());
  bool all_same = true;
  for (const auto& [path, layout] :
       {std::pair{st_path, WeightLayout::Single}, std::pair{pt_path, WeightLayout::Contiguous}}) {
    const Checkpoint ckpt = load_checkpoint(path);
    GroupedLinearOptions lo = o;
    lo.weight_layout = layout;
    lo.seed = c.seed + 11;
    auto root = std::make_shared<Sequential>();
    auto mid = std::make_shared<Sequential>();
    auto layer = std::make_shared<GroupedLinear>(lo);
    mid->add_child("fc1", layer);
    root->add_child("experts", mid);
    const LoadReport r = root->load_state_dict(ckpt.tensors);
    const bool same_file = layer->forward(x, splits).bit_equal(y_trained);
    all_same = all_same && same_file;
    std::printf(
        "   %s (%s, %zu tensors) -> %s layer%s: outputs %s\n", path.c_str(),
        std::string(format_name(ckpt.format)).c_str(), ckpt.tensors.size(),
        std::string(layout_name(layout)).c_str(),
        r.layout_conversions.empty()
            ? ""
            : (" (converted from " + std::string(layout_name(r.layout_conversions[0].from)) + ")")
                  .c_str(),
        same_file ? "bit-identical" : "DIFFERENT");
  }
  if (c.out_dir.empty()) std::filesystem::remove_all(dir);
  if (!all_same)
    throw Error(ErrorCode::InvalidArgument, "demo: outputs differ after reloading a file");
  std::printf("\ndemo finished: loss went down, and every layout and file kept every bit\n");
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto config = std::make_shared<DemoConfig>();
  CLI::App* cmd = app.add_subcommand(
      "demo", "Train a small MoE layer, move its weights to another layout, check the outputs");
  // --num-experts, not --experts: convert's --experts B:E takes a range of a checkpoint's experts.
  cmd->add_option("--num-experts", config->experts,
                  "how many experts the demo layer has, 3..4096 (default 8)")
      ->check(CLI::Range(3, 4096));
  cmd->add_option("--steps", config->steps, "SGD steps")->check(CLI::Range(1, 10000));
  cmd->add_option("--seed", config->seed, "seed for weights and data");
  cmd->add_option("--out-dir", config->out_dir,
                  "keep the demo's checkpoint files in this existing folder (default: a temporary "
                  "folder, removed at the end)")
      ->check(CLI::ExistingDirectory);
  cmd->footer(
      "Trains in one layout, moves the weights to another layout through a state dict and through\n"
      "checkpoint files, and checks that the outputs are bit-identical. Exit 0 when every check\n"
      "held; 2 when one did not (the message says which) or on bad usage.\n\n"
      "Examples:\n"
      "  grouplin demo\n"
      "  grouplin demo --num-experts 64 --steps 20 --seed 7\n"
      "  grouplin demo --out-dir /tmp/demo   # keep its checkpoints to inspect them");
  cmd->callback([config] { run_demo(*config); });
}

}  // namespace grouplin::cli
