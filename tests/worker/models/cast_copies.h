// Shared by the CPU and GPU tests of compute_dtype_weights.h through whole models.
#pragma once

#include <cstdint>

#include "worker/models/layers.h"
#include "worker/models/model.h"

namespace trainyard::testing {

// How many times the model's own linear layers (AdaptableLinear, Conv1D) made cast
// copies of their weights.
inline int64_t CastCopiesMade(Model& model) {
  int64_t made = 0;
  for (const auto& module : model->modules(/*include_self=*/false)) {
    if (const auto* linear = module->as<AdaptableLinearImpl>()) made += linear->cast.copies_made();
    if (const auto* conv = module->as<Conv1DImpl>()) made += conv->cast.copies_made();
  }
  return made;
}

}  // namespace trainyard::testing
