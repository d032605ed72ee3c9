// Expert parallelism, end to end: four ranks (mpirun -np 4) share the experts of a Hugging Face
// MoE block (Qwen3-MoE names: experts.{i}.gate_proj / up_proj / down_proj, a sharded directory
// with its index and config.json). Each rank loads only its experts into two GroupedLinears
// (gate_up_proj, down_proj), sends its tokens to the experts' ranks once (ExpertDispatcher), runs
// the expert MLP (down(silu(gate) * up)) forward and backward, takes an SGD step, and the ranks
// save one sharded directory together. Then rank 0, alone, loads every expert of the input
// checkpoint, runs every rank's tokens through all of them, steps, and checks the ranks' outputs,
// input gradients and saved weights against its own, bit for bit.
//
//   mpirun -np 4 --oversubscribe build/examples/expert_parallel_example [work-dir]
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "grouplin/checkpoint.hpp"
#include "grouplin/expert_parallel.hpp"
#include "grouplin/module.hpp"
#include "grouplin/optimizer.hpp"
#include "grouplin/safetensors.hpp"
#include "grouplin/sharded_checkpoint.hpp"

namespace fs = std::filesystem;
using grouplin::DType;
using grouplin::Tensor;

constexpr int64_t kExperts = 8, kHidden = 64, kInter = 32;
const std::string kPrefix = "model.layers.0.mlp.experts.";

float value_at(uint64_t seed, uint64_t i) {
  uint64_t s = (seed * 0x9E3779B97F4A7C15ull) ^ (i * 0xD1B54A32D192ED03ull);
  s ^= s >> 29;
  s *= 0xBF58476D1CE4E5B9ull;
  s ^= s >> 32;
  return static_cast<float>(s % 2001) / 1000.0f - 1.0f;
}

Tensor random_tensor(const grouplin::Shape& shape, uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(static_cast<size_t>(grouplin::shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * value_at(seed, i);
  return Tensor::from_f32(shape, v);
}

// The input checkpoint as Hugging Face writes a module list, in two shards with an index.
void write_hf_checkpoint(const std::string& dir) {
  fs::create_directories(dir);
  grouplin::StateDict shards[2];
  grouplin::ShardIndex index;
  uint64_t total = 0;
  for (int64_t e = 0; e < kExperts; ++e) {
    const std::string p = kPrefix + std::to_string(e) + ".";
    const int s = e < kExperts / 2 ? 0 : 1;
    const std::pair<std::string, Tensor> entries[] = {
        {p + "gate_proj.weight", random_tensor({kInter, kHidden}, 10 + e, 0.2f)},
        {p + "up_proj.weight", random_tensor({kInter, kHidden}, 30 + e, 0.2f)},
        {p + "down_proj.weight", random_tensor({kHidden, kInter}, 50 + e, 0.2f)}};
    for (const auto& [name, t] : entries) {
      shards[s].insert(name, t);
      index.weight_map.emplace_back(
          name, grouplin::shard_file_name(grouplin::CheckpointFormat::Safetensors, s, 2));
      total += t.nbytes();
    }
  }
  std::sort(index.weight_map.begin(), index.weight_map.end());
  index.total_size = total;
  for (int s = 0; s < 2; ++s) {
    grouplin::save_safetensors(
        dir + "/" + grouplin::shard_file_name(grouplin::CheckpointFormat::Safetensors, s, 2),
        shards[s], {{"format", "pt"}});
  }
  std::FILE* f = std::fopen((dir + "/model.safetensors.index.json").c_str(), "w");
  std::fputs(grouplin::shard_index_json(index).c_str(), f);
  std::fclose(f);
  f = std::fopen((dir + "/config.json").c_str(), "w");
  std::fputs("{\"model_type\": \"qwen3_moe\", \"num_experts\": 8}\n", f);
  std::fclose(f);
}

// The experts of one rank (or all of them): gate_up_proj and down_proj under one root, the names
// Hugging Face rules load a module list into.
struct ExpertMlp {
  std::shared_ptr<grouplin::Sequential> root = std::make_shared<grouplin::Sequential>();
  std::shared_ptr<grouplin::GroupedLinear> gate_up, down;
  Tensor h, a;  // saved for backward: gate_up's output and the activation

  explicit ExpertMlp(int64_t experts) {
    grouplin::GroupedLinearOptions o;
    o.num_gemms = experts;
    o.bias = false;
    o.in_features = kHidden;
    o.out_features = 2 * kInter;
    gate_up = std::make_shared<grouplin::GroupedLinear>(o);
    o.in_features = kInter;
    o.out_features = kHidden;
    down = std::make_shared<grouplin::GroupedLinear>(o);
    root->add_child("gate_up_proj", gate_up);
    root->add_child("down_proj", down);
  }

  static float silu(float g) { return g / (1.0f + std::exp(-g)); }

  Tensor forward(const Tensor& x, const std::vector<int64_t>& splits) {
    h = gate_up->forward(x, splits);
    a = Tensor::zeros({x.dim(0), kInter}, DType::F32);
    const float* hp = h.data_as<float>();
    float* ap = a.mutable_data_as<float>();
    for (int64_t r = 0; r < x.dim(0); ++r) {
      for (int64_t j = 0; j < kInter; ++j) {
        ap[r * kInter + j] = silu(hp[r * 2 * kInter + j]) * hp[r * 2 * kInter + kInter + j];
      }
    }
    return down->forward(a, splits);
  }

  Tensor backward(const Tensor& dy) {
    const Tensor da = down->backward(dy);
    Tensor dh = Tensor::zeros(h.shape(), DType::F32);
    const float* hp = h.data_as<float>();
    const float* dap = da.data_as<float>();
    float* dhp = dh.mutable_data_as<float>();
    for (int64_t r = 0; r < h.dim(0); ++r) {
      for (int64_t j = 0; j < kInter; ++j) {
        const float g = hp[r * 2 * kInter + j], u = hp[r * 2 * kInter + kInter + j];
        const float sig = 1.0f / (1.0f + std::exp(-g));
        dhp[r * 2 * kInter + j] = dap[r * kInter + j] * u * sig * (1.0f + g * (1.0f - sig));
        dhp[r * 2 * kInter + kInter + j] = dap[r * kInter + j] * silu(g);
      }
    }
    return gate_up->backward(dh);
  }
};

// Rank r's tokens and the experts the router picked for them.
struct Tokens {
  Tensor x, dy;
  std::vector<int64_t> expert;
};
Tokens tokens_of(int r) {
  const int64_t rows = 12 + 5 * r;
  Tokens t{random_tensor({rows, kHidden}, 100 + r), random_tensor({rows, kHidden}, 200 + r), {}};
  for (int64_t i = 0; i < rows; ++i) t.expert.push_back((i * 5 + 3 * r) % kExperts);
  return t;
}

// All ranks' rows of `t` [rows, cols] F32, rank after rank, on rank 0.
Tensor gather_rows(const Tensor& t, int ranks, int64_t total_rows) {
  const int mine = static_cast<int>(t.numel());
  std::vector<int> counts(static_cast<size_t>(ranks)), offsets(static_cast<size_t>(ranks), 0);
  MPI_Gather(&mine, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  for (int r = 1; r < ranks; ++r) offsets[r] = offsets[r - 1] + counts[r - 1];
  Tensor all = Tensor::zeros({total_rows, t.dim(1)}, DType::F32);
  MPI_Gatherv(t.data(), mine, MPI_FLOAT, all.mutable_data(), counts.data(), offsets.data(),
              MPI_FLOAT, 0, MPI_COMM_WORLD);
  return all;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const std::string work =
      argc > 1 ? argv[1] : (fs::temp_directory_path() / "grouplin-ep-example").string();
  const std::string input = work + "/Qwen3-moe-tiny", output = work + "/after-step";
  int status = 0;
  try {
    grouplin::agree_on(MPI_COMM_WORLD, [&] {
      if (rank != 0) return;
      fs::remove_all(work);
      write_hf_checkpoint(input);
    });

    // 1. Every rank: its experts, from the shared checkpoint (only their bytes are read).
    grouplin::ExpertDispatcher route(MPI_COMM_WORLD, kExperts);
    const grouplin::ExpertRange range = route.experts();
    ExpertMlp mlp(range.end - range.begin);
    grouplin::load_experts(MPI_COMM_WORLD, *mlp.root, input, {.prefix = kPrefix, .experts = range});

    // 2. Forward and backward: tokens to their experts' ranks, the MLP, results back.
    const Tokens mine = tokens_of(rank);
    const Tensor xs = route.dispatch(mine.x, mine.expert);
    const Tensor y = route.combine(mlp.forward(xs, route.local_splits()));
    const Tensor dx = route.combine(mlp.backward(route.redispatch(mine.dy)));
    grouplin::sgd_step(*mlp.root, 0.1f);

    // 3. One directory, a shard per rank; rank 0 adds the index and config.json.
    grouplin::save_experts(MPI_COMM_WORLD, *mlp.root, range, output,
                           {.prefix = kPrefix, .copy_files_from = input, .overwrite = true});
    std::printf("rank %d of %d: experts [%ld, %ld), %ld of its %ld tokens elsewhere, saved\n", rank,
                ranks, static_cast<long>(range.begin), static_cast<long>(range.end),
                static_cast<long>(
                    std::count_if(mine.expert.begin(), mine.expert.end(),
                                  [&](int64_t e) { return e < range.begin || e >= range.end; })),
                static_cast<long>(mine.expert.size()));

    // 4. Rank 0 alone: every expert, every token, the same step; the ranks' results compared.
    int64_t total = 0;
    std::vector<Tokens> all;
    for (int r = 0; r < ranks; ++r) {
      all.push_back(tokens_of(r));
      total += all.back().x.dim(0);
    }
    const Tensor y_all = gather_rows(y, ranks, total), dx_all = gather_rows(dx, ranks, total);
    if (rank == 0) {
      ExpertMlp one(kExperts);
      one.root->load_state_dict(grouplin::load_checkpoint(input).tensors, {.prefix = kPrefix});
      // The rows grouped by expert, rank after rank: the order the owners computed them in.
      std::vector<int64_t> splits(kExperts, 0), place;
      for (const Tokens& t : all) {
        for (int64_t e : t.expert) ++splits[static_cast<size_t>(e)];
      }
      std::vector<int64_t> next(kExperts, 0);
      for (int64_t e = 1; e < kExperts; ++e) next[e] = next[e - 1] + splits[e - 1];
      Tensor x = Tensor::zeros({total, kHidden}, DType::F32), dy = x.clone();
      for (const Tokens& t : all) {
        for (size_t i = 0; i < t.expert.size(); ++i) {
          place.push_back(next[static_cast<size_t>(t.expert[i])]++);
          x.select(place.back()).copy_from(t.x.select(static_cast<int64_t>(i)));
          dy.select(place.back()).copy_from(t.dy.select(static_cast<int64_t>(i)));
        }
      }
      const Tensor y1 = one.forward(x, splits), dx1 = one.backward(dy);
      grouplin::sgd_step(*one.root, 0.1f);
      int64_t wrong = 0;
      for (int64_t i = 0; i < total; ++i) {
        wrong += !y_all.select(i).bit_equal(y1.select(place[static_cast<size_t>(i)]));
        wrong += !dx_all.select(i).bit_equal(dx1.select(place[static_cast<size_t>(i)]));
      }
      ExpertMlp saved(kExperts);
      saved.root->load_state_dict(grouplin::load_checkpoint(output).tensors, {.prefix = kPrefix});
      for (int64_t e = 0; e < kExperts; ++e) {
        wrong += !saved.gate_up->expert_weight(e).bit_equal(one.gate_up->expert_weight(e));
        wrong += !saved.down->expert_weight(e).bit_equal(one.down->expert_weight(e));
      }
      std::printf(
          "single process: %ld tokens through %ld experts; outputs, input gradients and "
          "saved weights %s\n",
          static_cast<long>(total), static_cast<long>(kExperts),
          wrong == 0 ? "bit-identical to the ranks'" : "DIFFER");
      status = wrong == 0 ? 0 : 1;
    }
  } catch (const grouplin::Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    status = 2;
  }
  MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return status;
}
