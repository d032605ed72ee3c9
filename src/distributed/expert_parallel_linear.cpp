// ExpertParallelLinear: a GroupedLinear of this rank's experts behind an ExpertDispatcher.
// forward: dispatch x, the local experts' forward, combine; backward: the same with dy and dx.
#include <string>

#include "distributed/mpi_call.hpp"
#include "grouplin/dtype.hpp"
#include "grouplin/expert_parallel.hpp"

namespace grouplin {

namespace {

// The options that must be equal on every rank (the weight layouts may differ).
std::vector<int64_t> shared_options(const GroupedLinearOptions& o) {
  return {o.num_gemms,
          o.in_features,
          o.out_features,
          o.bias ? 1 : 0,
          static_cast<int64_t>(o.params_dtype),
          o.activation_dtype ? static_cast<int64_t>(*o.activation_dtype) : -1,
          o.fuse_wgrad_accumulation ? 1 : 0,
          static_cast<int64_t>(o.seed),
          o.first_expert};
}

const char* const kOptionNames[] = {"num_gemms",
                                    "in_features",
                                    "out_features",
                                    "bias",
                                    "params_dtype",
                                    "activation_dtype",
                                    "fuse_wgrad_accumulation",
                                    "seed",
                                    "first_expert"};

GroupedLinearOptions local_options(const GroupedLinearOptions& o, ExpertRange experts) {
  GroupedLinearOptions local = o;
  local.num_gemms = experts.end - experts.begin;
  local.first_expert = o.first_expert + experts.begin;
  return local;
}

}  // namespace

ExpertParallelLinear::ExpertParallelLinear(MPI_Comm comm, const GroupedLinearOptions& options)
    : options_(options), dispatcher_(comm, options.num_gemms) {
  const auto all =
      distributed::gather_agreed(dispatcher_.comm(), std::nullopt, shared_options(options));
  for (size_t r = 1; r < all.size(); ++r) {
    for (size_t i = 0; i < all[r].size(); ++i) {
      if (all[r][i] != all[0][i]) {
        throw Error(ErrorCode::RanksDisagree,
                    std::string("ExpertParallelLinear: option ") + kOptionNames[i] + " is " +
                        std::to_string(all[0][i]) + " on rank 0 and " + std::to_string(all[r][i]) +
                        " on rank " + std::to_string(r) + "; expected the same on every rank");
      }
    }
  }
  agree_on(dispatcher_.comm(), [&] {
    local_ = std::make_shared<GroupedLinear>(local_options(options, dispatcher_.experts()));
  });
}

namespace {

void check_matches(const Tensor& t, DType dtype, int64_t features, const char* name,
                   const char* side) {
  if (t.dtype() != dtype) {
    throw Error(ErrorCode::DTypeMismatch, std::string("ExpertParallelLinear: ") + name + " is " +
                                              std::string(dtype_name(t.dtype())) +
                                              ", expected the layer's " +
                                              std::string(dtype_name(dtype)));
  }
  if (t.dim(1) != features) {
    throw Error(ErrorCode::ShapeMismatch, std::string("ExpertParallelLinear: ") + name + " has " +
                                              std::to_string(t.dim(1)) + " features, expected " +
                                              side + " " + std::to_string(features));
  }
}

}  // namespace

Tensor ExpertParallelLinear::forward(const Tensor& x, std::span<const int64_t> expert_of_row) {
  const Tensor xs = dispatcher_.dispatch_checked(x, expert_of_row, [&] {
    check_matches(x, local_->activation_dtype(), options_.in_features, "x", "in_features");
  });
  Tensor ys;
  agree_on(dispatcher_.comm(), [&] { ys = local_->forward(xs, dispatcher_.local_splits()); });
  return dispatcher_.combine(ys);
}

Tensor ExpertParallelLinear::backward(const Tensor& dy) {
  const Tensor dys = dispatcher_.redispatch_checked(dy, [&] {
    check_matches(dy, local_->activation_dtype(), options_.out_features, "dy", "out_features");
  });
  Tensor dxs;
  agree_on(dispatcher_.comm(), [&] { dxs = local_->backward(dys); });
  return dispatcher_.combine(dxs);
}

LoadReport ExpertParallelLinear::load(const std::string& path, LoadOptions options) {
  options.experts = dispatcher_.experts();
  return load_experts(dispatcher_.comm(), *local_, path, std::move(options));
}

}  // namespace grouplin
