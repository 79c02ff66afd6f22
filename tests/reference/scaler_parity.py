#!/usr/bin/env python3
"""Loss-scaling parity: for the same planted pattern of inf gradients, our GradScaler
produces the same sequence of scales and skipped steps as torch.amp.GradScaler, and
AdamW leaves the same weights. --device cuda runs both on the GPU (exit 77 without one)."""
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_test, skip  # noqa: E402

PATTERN = "00100001100000000010000000100"
INIT_SCALE = 1024.0
GROWTH_INTERVAL = 3


def reference(device):
    w = torch.ones(4, device=device, requires_grad=True)
    opt = torch.optim.AdamW([w], lr=1e-3, weight_decay=0.0)
    scaler = torch.amp.GradScaler(device, init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL)
    scales, skipped = [], []
    for planted in PATTERN:
        loss = (w * w).sum()
        scaler.scale(loss).backward()
        if planted == "1":
            with torch.no_grad():
                w.grad[1] = float("inf")
        scaler.step(opt)
        found = sum(v.item() for v in scaler._found_inf_per_device(opt).values()) > 0
        scaler.update()
        opt.zero_grad()
        scales.append(scaler.get_scale())
        skipped.append(found)
    return scales, skipped, w.detach().tolist()


def test(args, work):
    if args.device == "cuda" and not torch.cuda.is_available():
        skip("no CUDA device is visible to torch on this machine")
    out = subprocess.run([args.probe, "scaler", PATTERN, str(INIT_SCALE), str(GROWTH_INTERVAL),
                          "--device", args.device], capture_output=True, text=True, check=True)
    ours = json.loads(out.stdout)
    scales, skipped, weights = reference(args.device)
    print("torch scales:", scales)
    print("our scales:  ", ours["scales"])
    print("torch skipped:", [int(s) for s in skipped])
    print("our skipped:  ", [int(s) for s in ours["skipped"]])
    ok = ours["scales"] == scales and ours["skipped"] == skipped
    wdiff = max(abs(a - b) for a, b in zip(weights, ours["weights"]))
    print(f"max |weight diff| after {len(PATTERN)} steps: {wdiff:.3e}")
    taken = len(PATTERN) - sum(skipped)
    print(f"optimizer steps taken: torch {taken}, ours {ours['optimizer_steps']}")
    check(ok and wdiff <= 1e-6 and any(skipped) and ours["optimizer_steps"] == taken,
          f"scales and skips equal torch's {ok}, weights within {wdiff:.3e} (1e-6 at most), a step skipped "
          f"{any(skipped)}, optimizer steps {ours['optimizer_steps']} (torch {taken})")


if __name__ == "__main__":
    run_test(test, ("--probe",), __doc__,
             options=lambda p: p.add_argument("--device", choices=("cpu", "cuda"), default="cpu"))
