#!/usr/bin/env python3
"""How much of a graphed bf16 training step autocast's weight casts cost, measured on
PyTorch alone, before the worker grows a bf16-weights mode (issue item "bf16 without the
casts"). Hugging Face's BertForSequenceClassification (the preset's shape, random
weights, random token ids, every row full length) takes whole-step CUDA graphs in two
ways, each with clipping and a fused, capturable AdamW inside the graph:

  autocast      fp32 weights; autocast casts each product's weight to bf16 on every
                forward, and its backward casts the bf16 gradient back to fp32;
  bf16_weights  the products' weights (every nn.Linear) kept in bf16; fp32 master copies
                live in the optimizer: after backward the bf16 gradients are copied into
                the masters' fp32 gradients with one foreach copy, clipping and AdamW run
                on the masters, and one foreach copy writes them back into the bf16 weights.

Each variant is captured once and replayed; a replay's time is the device's step time,
since nothing in it waits for the host. Prints each variant's median ms/step over
--repeats rounds of --steps replays, the ratio, and each variant's losses over the first
replays (both must fall). --device cpu runs the same steps eagerly, without graphs
(a check of the bookkeeping, not a timing).

    scripts/gpu/bf16_weights_vs_autocast.py [--preset base] [--batch 64] [--seq 128]
        [--steps 50] [--repeats 5] [--device cuda|cpu] [--json FILE]
"""
import argparse
import json
import statistics
import time

import torch
from transformers import BertConfig, BertForSequenceClassification

PRESETS = {"tiny": (128, 2, 2, 512), "mini": (256, 4, 4, 1024), "base": (768, 12, 12, 3072)}


def build(preset, seq, device, seed):
    hidden, layers, heads, inter = PRESETS[preset]
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=8000, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                        intermediate_size=inter, max_position_embeddings=seq, num_labels=8)
    return BertForSequenceClassification(config).to(device).train()


class AutocastStep:
    """fp32 weights, autocast to bf16: the worker's train.precision: bf16 today."""

    def __init__(self, model, device):
        self.model, self.device = model, device
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=1e-4, fused=device == "cuda", capturable=device == "cuda")

    def __call__(self, ids, mask, labels):
        for p in self.params:
            p.grad = None
        # Inside a graph capture autocast's weight-cast cache must be off.
        with torch.autocast(self.device, torch.bfloat16, cache_enabled=False):
            loss = self.model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0, foreach=True)
        self.opt.step()
        return loss.detach()


class Bf16WeightsStep:
    """Products' weights stored in bf16, fp32 masters in the optimizer."""

    def __init__(self, model, device):
        self.model, self.device = model, device
        self.low = []
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                for p in module.parameters(recurse=False):
                    p.data = p.data.to(torch.bfloat16)
                    self.low.append(p)
        low_ids = {id(p) for p in self.low}
        self.masters = [p.detach().float().clone().requires_grad_(True) for p in self.low]
        self.fp32 = [p for p in model.parameters() if p.requires_grad and id(p) not in low_ids]
        self.opt_params = self.masters + self.fp32
        self.opt = torch.optim.AdamW(self.opt_params, lr=1e-4, fused=device == "cuda", capturable=device == "cuda")
        for m in self.masters:
            m.grad = torch.zeros_like(m)

    def __call__(self, ids, mask, labels):
        for p in self.low + self.fp32:
            p.grad = None
        with torch.autocast(self.device, torch.bfloat16, cache_enabled=False):
            loss = self.model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch._foreach_copy_([m.grad for m in self.masters], [p.grad for p in self.low])
        torch.nn.utils.clip_grad_norm_(self.opt_params, 1.0, foreach=True)
        self.opt.step()
        with torch.no_grad():
            torch._foreach_copy_(self.low, self.masters)
        return loss.detach()


def batch(args, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 8000, (args.batch, args.seq), generator=g)
    labels = torch.randint(0, 8, (args.batch,), generator=g)
    return ids.to(args.device), torch.ones_like(ids).to(args.device), labels.to(args.device)


def capture_whole_step(step, *inputs):
    """Warms `step` up on a side stream (as torch.cuda.graphs asks), then captures one
    call of it. Returns the graph and what the captured call returned (its output
    tensors, which each replay refills)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step(*inputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(*inputs)
    return graph, out


def run_variant(args, make):
    model = build(args.preset, args.seq, args.device, seed=0)
    step = make(model, args.device)
    ids, mask, labels = batch(args, seed=1)
    if args.device == "cpu":
        losses = [step(ids, mask, labels).item() for _ in range(args.steps)]
        return {"losses": losses[:10]}
    graph, loss = capture_whole_step(step, ids, mask, labels)
    losses = []
    for _ in range(10):
        graph.replay()
        losses.append(loss.item())
    rounds = []
    for _ in range(args.repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.steps):
            graph.replay()
        end.record()
        end.synchronize()
        rounds.append(start.elapsed_time(end) / args.steps)
    return {"ms_per_step": statistics.median(rounds), "rounds_ms": rounds, "losses": losses}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="base")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--json", default="")
    args = p.parse_args()
    t0 = time.time()
    result = {"preset": args.preset, "batch": args.batch, "seq": args.seq, "torch": torch.__version__}
    for name, make in (("autocast", AutocastStep), ("bf16_weights", Bf16WeightsStep)):
        result[name] = run_variant(args, make)
        r = result[name]
        timing = f"{r['ms_per_step']:.2f} ms/step (rounds {[round(x, 2) for x in r['rounds_ms']]})" \
            if "ms_per_step" in r else "eager, untimed"
        print(f"{name:13} {timing}; losses {[round(x, 4) for x in r['losses']]}", flush=True)
    falling = all(result[n]["losses"][-1] < result[n]["losses"][0] for n in ("autocast", "bf16_weights"))
    if "ms_per_step" in result["autocast"]:
        ratio = result["bf16_weights"]["ms_per_step"] / result["autocast"]["ms_per_step"]
        result["ratio"] = ratio
        print(f"bf16_weights / autocast: {ratio:.3f} (graphed replays, device time)")
    print(f"losses fall in both: {falling}; {time.time() - t0:.0f} s")
    if args.json:
        json.dump(result, open(args.json, "w"), indent=1)
    raise SystemExit(0 if falling else 1)


if __name__ == "__main__":
    main()
