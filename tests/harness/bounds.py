"""Tolerances derived from the computation, for the Python reference tests: the rule of
tests/worker/numeric_bounds.h (which says why), on torch tensors.

A float32 result of ours (the candidate) is held against the same computation in float64
(the exact value, for float32's purposes), and may be off from it by at most
ROUNDING_FACTOR times the error that the reference's own float32 path (the baseline: HF
in float32) makes on the same inputs, on this CPU's kernels; or, where the baseline
happens to land nearly exactly, ROUNDING_FACTOR float32 roundings at the result's own
scale. Both paths sum the same terms in other orders, so their errors are of one size
whichever kernels ATen and oneDNN pick; a real fault (a wrong row, a dropped term, a
missing scale) is off by the size of the values."""
import copy

import torch

ROUNDING_FACTOR = 8.0
FLOAT32_EPSILON = torch.finfo(torch.float32).eps


def within_rounding_of(candidate, baseline, exact, factor=ROUNDING_FACTOR):
    """(ok, detail): max |candidate - exact| <= factor x max(max |baseline - exact|,
    float32's epsilon x max |exact|). The detail names every figure, for the test's output."""
    exact = exact.double()
    if candidate.shape != exact.shape or baseline.shape != exact.shape:
        return False, f"shapes differ: {tuple(candidate.shape)}, {tuple(baseline.shape)}, {tuple(exact.shape)}"
    scale = exact.abs().max().item() if exact.numel() else 0.0
    floor = FLOAT32_EPSILON * scale
    baseline_error = (baseline.double() - exact).abs().max().item() if exact.numel() else 0.0
    candidate_error = (candidate.double() - exact).abs().max().item() if exact.numel() else 0.0
    bound = factor * max(baseline_error, floor)
    detail = (f"error against float64 {candidate_error:.2e}, the float32 reference's {baseline_error:.2e}: "
              f"bound {bound:.2e} ({factor:g} x the larger of that and one rounding at scale {scale:.2f})")
    return candidate_error <= bound, detail


def in_float64(model):
    """A float64 copy of a torch module, in eval mode (the module itself is left as it is)."""
    return copy.deepcopy(model).double().eval()
