#!/usr/bin/env python3
"""Where PyTorch's own bf16 training step spends its device time, by kernel kind, with
and without Inductor's fusion: the budget the worker's fused paths (bias+GELU,
dropout+residual+LayerNorm, bf16 weights) are aimed at.

Hugging Face's BertForSequenceClassification (the preset's shape, random weights and
token ids, every row full length, autocast to bf16, clipping, fused AdamW) runs in two
ways, each profiled with Kineto over --steps steps after warm-up:

  graphed    the whole step captured as one CUDA graph and replayed, kernels as eager
             PyTorch launches them (the worker's train.cuda_graph does the same);
  compiled   the model under torch.compile(mode="reduce-overhead"): Inductor's fused
             Triton kernels, replayed from its CUDA graphs; the optimizer eager, as
             scripts/bench/train_step_reference.py --compile runs it.

For each: device milliseconds per step by kind (products, attention, LayerNorm,
elementwise, reductions, optimizer, Inductor's Triton kernels, copies), kernels per
step, and the kernels that take the most time.

    scripts/gpu/step_kernels.py [--preset base] [--batch 64] [--seq 128] [--steps 5]
        [--variants graphed,compiled] [--top 12]
"""
import argparse
import collections
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bf16_weights_vs_autocast import AutocastStep, build, capture_whole_step  # noqa: E402

# First match wins: a kernel's kind from its name.
KINDS = [
    ("triton (Inductor's fused)", ("triton_",)),
    ("attention", ("sdpa", "fmha", "flash", "cudnn")),
    ("products (GEMM)", ("nvjet", "gemm", "cutlass", "xmma", "sm90_")),
    ("LayerNorm", ("layer_norm", "LayerNorm", "GammaBeta")),
    ("optimizer (foreach/fused AdamW)", ("multi_tensor_apply", "fused_adam", "_foreach")),
    ("dropout", ("dropout",)),
    ("reductions", ("reduce_kernel",)),
    ("elementwise", ("elementwise",)),
    ("copies and memsets", ("Memcpy", "Memset", "CatArray")),
]


def kind_of(name):
    for kind, marks in KINDS:
        if any(m in name for m in marks):
            return kind
    return "other"


def profiled(step_fn, steps):
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step_fn()
        torch.cuda.synchronize()
    by_name = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by_name[e.name][0] += 1
            by_name[e.name][1] += e.device_time_total / 1000.0
    return by_name


def report(name, by_name, steps, top):
    total = sum(ms for _, ms in by_name.values()) / steps
    count = sum(n for n, _ in by_name.values()) / steps
    kinds = collections.defaultdict(float)
    for kernel, (_, ms) in by_name.items():
        kinds[kind_of(kernel)] += ms / steps
    print(f"\n=== {name}: {total:.2f} ms of kernels per step, {count:.0f} kernels per step")
    print(f"{'kind':34} {'ms/step':>8} {'share':>7}")
    for kind, ms in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"{kind:34} {ms:8.2f} {ms / total:7.1%}")
    print(f"{'kernel (top ' + str(top) + ')':96} {'calls/step':>10} {'ms/step':>8}")
    for kernel, (n, ms) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"{kernel[:96]:96} {n / steps:10.0f} {ms / steps:8.3f}")


def graphed(args, ids, mask, labels):
    step = AutocastStep(build(args.preset, args.seq, "cuda", seed=0), "cuda")
    graph, _ = capture_whole_step(step, ids, mask, labels)
    for _ in range(5):
        graph.replay()
    return graph.replay


def compiled(args, ids, mask, labels):
    model = build(args.preset, args.seq, "cuda", seed=0)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    model = torch.compile(model, mode="reduce-overhead")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", torch.bfloat16):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()

    for _ in range(10):  # compilation, the graphs' recording, then warm replays
        step()
    torch.cuda.synchronize()
    return step


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="base")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--variants", default="graphed,compiled")
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1000, 8000, (args.batch, args.seq), generator=g).cuda()
    labels = torch.randint(0, 8, (args.batch,), generator=g).cuda()
    mask = torch.ones_like(ids)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}; {args.preset}, batch {args.batch} x seq "
          f"{args.seq}, bf16 autocast, {args.steps} profiled steps", flush=True)
    for name in args.variants.split(","):
        t0 = time.time()
        step_fn = {"graphed": graphed, "compiled": compiled}[name](args, ids, mask, labels)
        report(name, profiled(step_fn, args.steps), args.steps, args.top)
        print(f"({name}: {time.time() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
