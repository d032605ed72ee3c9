// Plain SGD over a module tree.
//
//   grouplin::Sequential model;         // any module tree, after a backward pass
//   grouplin::sgd_step(model, 0.01f);   // value -= lr * gradient, for every parameter
//   grouplin::zero_grad(model);
#pragma once

#include "grouplin/module.hpp"

namespace grouplin {

// For every parameter with a gradient: value -= lr * gradient, where the gradient is main_grad
// when defined (fuse_wgrad_accumulation) and grad otherwise. Computed in F32, rounded once to
// the parameter's dtype. Borrowed parameters (read-only views, see writable_value) are copied
// first.
void sgd_step(Module& module, float lr);

// Sets every grad and main_grad of the tree to zero.
void zero_grad(Module& module);

}  // namespace grouplin
