// GELU (the exact, erf form) and its derivative in one pass, torch-free so it compiles
// with its own flags (see layers.h's Gelu for why and where it is used).
#pragma once

#include <cstdint>

namespace trainyard::gelu {

// y[i] = u[i] * Phi(u[i]) and slope[i] = dy/du = Phi(u[i]) + u[i] * phi(u[i]), for
// i < n, where Phi and phi are the standard normal CDF and density. erf is the
// Abramowitz-Stegun 7.1.26 approximation that ATen's vectorised GELU uses (absolute
// error under 1.5e-7), with exp(-u^2/2) computed once for it and for phi.
void GeluWithSlope(const float* u, int64_t n, float* y, float* slope);

}  // namespace trainyard::gelu
