// GroupLin: the grouped linear layer of Mixture-of-Experts models, its weight layouts and
// checkpoints. Include this one header (#include "grouplin/grouplin.hpp") for the public API;
// authors of modules add grouplin/module_extension.hpp.
//
//   grouplin::GroupedLinear fc({.num_gemms = 8, .in_features = 64, .out_features = 128});
//   grouplin::Tensor x = grouplin::Tensor::zeros({10, 64}, grouplin::DType::F32);
//   std::vector<int64_t> m_splits = {1, 2, 0, 3, 0, 4, 0, 0};  // rows per expert, sum = 10
//   grouplin::Tensor y = fc.forward(x, m_splits);              // [10, 128]
#pragma once

#include "grouplin/checkpoint.hpp"
#include "grouplin/checkpoint_layout.hpp"
#include "grouplin/compare.hpp"
#include "grouplin/convert.hpp"
#include "grouplin/dtype.hpp"
#include "grouplin/error.hpp"
#include "grouplin/expert_block.hpp"
#include "grouplin/file.hpp"
#include "grouplin/grouped_gemm.hpp"
#include "grouplin/grouped_linear.hpp"
#include "grouplin/grouped_tensor.hpp"
#include "grouplin/inspect.hpp"
#include "grouplin/layout.hpp"
#include "grouplin/load_state_dict.hpp"
#include "grouplin/module.hpp"
#include "grouplin/optimizer.hpp"
#include "grouplin/pt_file.hpp"
#include "grouplin/runtime.hpp"
#include "grouplin/safetensors.hpp"
#include "grouplin/sharded_checkpoint.hpp"
#include "grouplin/state_dict.hpp"
#include "grouplin/storage.hpp"
#include "grouplin/tensor.hpp"
#include "grouplin/version.hpp"
