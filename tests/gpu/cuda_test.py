#!/usr/bin/env python3
"""The CUDA paths, run on a GPU against PyTorch and Hugging Face on the same GPU. Each
case exits 77 (ctest: skipped), saying so, where torch sees no CUDA device.

  parity  our BERT's logits on CUDA equal HF BertForSequenceClassification's on the
          same weights and inputs: fp32 (TF32 off) within 1e-4 absolute; bf16 and fp16
          autocast within a relative L2 error of 2e-2 and 5e-3 of HF's under the same
          autocast (both sides round differently, so neither is exact)
  train   fine-tuning on CUDA (dropout off): fp32 losses follow the CPU run of the same
          job (TF32 off) within 1e-3 relative over 30 steps; bf16 and fp16 (loss
          scaling) each train langid to > 0.9 dev accuracy; fp16 reports its scale
  graph   CUDA-graph replays give the eager logits within 1e-5 (fp32), and a benchmark
          job's cuda_graph cells in fp32/bf16/fp16 are all measured
  graph_train  whole-step CUDA graphs (train.cuda_graph: true) against eager steps of the
          same job, fp32 with TF32 off and dropout off, under loss scaling with an inf
          planted at step 7: over 20 steps the losses and the final weights agree within
          1e-6, step 7 is skipped in both, the loss-scale sequence is
          torch.amp.GradScaler's for the same skips, and the graphed evaluation's loss
          and accuracy are the eager one's within 1e-6
  graph_train_masters  the graphed step with bf16 weights (train.bf16_weights: true, so
          the fp32 masters' gradient copy, clipping, AdamW and the copy back are in the
          graph) against the eager step of the same job, bf16, dropout off: over 20 steps
          the losses agree within 1e-3 relative and the saved fp32 masters within 2e-3
          (two steps of the learning rate), and both follow the graphed autocast run of
          the same job (fp32 weights, cast on each forward) within 5e-3 relative
  graph_train_packed  batches packed on the host (model.unpad: always: the varlen
          attention kernel over real tokens, token counts rounded up for the graphs), bf16,
          dropout off, 20 steps: graphed against eager within 1e-3 relative in the losses,
          and both against the padded graphed run of the same job within 2e-2 (the
          attention kernels round differently), with more than one graph captured
  graph_memory  200 graphed steps over batches padded to 4 lengths: at least 3 shapes are
          captured, and the allocator's memory in use does not move after the last capture
  graph_nccl  one rank on the data-parallel path (distributed.backend: nccl, so the
          gradient all-reduce and the found_inf agreement are inside the graph): its 20
          graphed steps' losses equal the eager single-process run's within 1e-6
  generate  greedy GPT-2 generation on CUDA gives HF generate's token ids on the same GPU
          (batch 1, and 4 left-padded), and decoding through a captured CUDA graph gives
          the same ids as the growing decode steps; a benchmark job's generate cells,
          eager and cuda_graph in fp32/bf16/fp16, are all measured
"""
import csv
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_case  # noqa: E402
from harness.e2e import FULL_DEV, LANGID, job_yaml, require_cuda, steps, subset_tsv, weights, write  # noqa: E402


def relative_l2(a, b):
    return ((a - b).norm() / b.norm()).item()


def probe_logits(args, folder, inputs_path, precision):
    import torch
    out = subprocess.run([args.probe, "logits", folder, inputs_path, "--device", "cuda", "--precision", precision],
                         capture_output=True, text=True, check=True)
    return torch.tensor(json.loads(out.stdout)["logits"])


def parity(args, work):
    import torch
    from reference.model_parity import make_model, padded_inputs
    torch.backends.cuda.matmul.allow_tf32 = False
    folder = os.path.join(work, "hf")
    model = make_model(folder).cuda()
    ids, mask = padded_inputs()
    inputs = write(os.path.join(work, "inputs.json"), json.dumps({"input_ids": ids.tolist(),
                                                                  "attention_mask": mask.tolist()}))
    ok = True
    limits = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 5e-3}
    with torch.no_grad():
        fp32 = model(input_ids=ids.cuda(), attention_mask=mask.cuda()).logits.float().cpu()
    for precision, dtype in (("fp32", None), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        with torch.no_grad(), torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            expected = model(input_ids=ids.cuda(), attention_mask=mask.cuda()).logits.float().cpu()
        ours = probe_logits(args, folder, inputs, precision)
        if precision == "fp32":
            error = (ours - expected).abs().max().item()
            print(f"fp32: max |logit diff| {error:.2e} (limit 1e-4; logit scale {expected.abs().max().item():.2f})")
        else:
            error = relative_l2(ours, expected)
            print(f"{precision}: relative L2 vs HF under the same autocast {error:.2e} (limit {limits[precision]:.0e}); "
                  f"ours vs fp32 {relative_l2(ours, fp32):.2e}, HF vs fp32 {relative_l2(expected, fp32):.2e}")
        ok = ok and error <= limits[precision]
    check(ok, "our logits are off HF's beyond a precision's limit (the lines above)")


def epochs(run_dir):
    with open(os.path.join(run_dir, "epochs.csv")) as f:
        return list(csv.DictReader(f))


def run_job(args, work, name, device, extra, train_count):
    train = subset_tsv(work, train_count)
    text = job_yaml(name, train, extra, device=device, dev=FULL_DEV).replace("  dropout: 0.1", "  dropout: 0.0")
    job = write(os.path.join(work, name + ".yaml"), text)
    runs = os.path.join(work, "runs")
    result = subprocess.run([args.worker, job, "--runs-dir", runs], capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        print(result.stdout[-3000:], result.stderr[-3000:])
    check(result.returncode == 0, f"{name} failed with exit code {result.returncode}")
    return os.path.join(runs, name)


def train(args, work):
    same = "train:\n  batch_size: 16\n  max_steps: 30\n  epochs: 1\n  lr: 1.0e-3\n"
    cpu = run_job(args, work, "fp32_cpu", "cpu", same, 1000)
    gpu = run_job(args, work, "fp32_cuda", "cuda", same, 1000)
    a = [s["loss"] for s in steps(cpu)]
    b = [s["loss"] for s in steps(gpu)]
    worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    print(f"fp32 CPU vs CUDA over {len(a)} steps: worst relative loss difference {worst:.2e} (limit 1e-3)")
    ok = len(a) == len(b) == 30 and worst <= 1e-3
    for precision in ("bf16", "fp16"):
        run = run_job(args, work, f"{precision}_cuda", "cuda",
                      f"train:\n  batch_size: 32\n  epochs: 2\n  precision: {precision}\n", 6000)
        rows = epochs(run)
        last = rows[-1]
        scales = sorted({s["loss_scale"] for s in steps(run)})
        print(f"{precision}: dev accuracy {last['eval_acc']}, train loss {last['train_loss']}, "
              f"{last['ms_per_step']} ms/step, data wait {last['data_wait_pct']}%, loss scale column "
              f"'{last['loss_scale']}', skipped steps {sum(int(r['skipped_steps']) for r in rows)}")
        ok = ok and float(last["eval_acc"]) > 0.9
        if precision == "fp16":
            ok = ok and last["loss_scale"] != "" and float(last["loss_scale"]) > 0 and len(scales) >= 1
    check(ok, "CUDA's fp32 losses are off the CPU's, or a mixed-precision run fell short (the lines above)")


GRAPH_STEPS = ("train:\n  batch_size: 16\n  max_steps: 20\n  epochs: 1\n  lr: 1.0e-3\n  cuda_graph: {graph}\n"
               "  loss_scale: {{init_scale: 1024, growth_interval: 3}}\n"
               "debug:\n  force_loss_scaling: true\n  plant_inf_step: 7\n")


def run_graph_job(args, work, name, text, train_count, mpirun_ranks=0, model=""):
    train = subset_tsv(work, train_count)
    job_text = job_yaml(name, train, text, device="cuda", dev=FULL_DEV).replace("  dropout: 0.1", "  dropout: 0.0")
    job_text = job_text.replace("  preset: tiny\n", "  preset: tiny\n" + model)
    job_text = job_text.replace("  max_seq_len: 64\n", "  max_seq_len: 64\n  pad_buckets: 4\n")
    job = write(os.path.join(work, name + ".yaml"), job_text)
    runs = os.path.join(work, "runs")
    command = [args.worker, job, "--runs-dir", runs]
    env = dict(os.environ)
    if mpirun_ranks:
        command = [args.mpirun, "-n", str(mpirun_ranks), "--bind-to", "none"] + command
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    if result.returncode != 0:
        print(result.stdout[-3000:], result.stderr[-3000:])
    check(result.returncode == 0, f"{name} failed with exit code {result.returncode}")
    with open(os.path.join(runs, name, "summary.json")) as f:
        summary = json.load(f)
    return os.path.join(runs, name), summary


def torch_scales(skipped, init_scale=1024.0, growth_interval=3):
    """torch.amp.GradScaler's scale after each step, for the same pattern of skipped steps."""
    import torch
    w = torch.ones(2, device="cuda", requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.0)
    scaler = torch.amp.GradScaler("cuda", init_scale=init_scale, growth_interval=growth_interval)
    scales = []
    for skip in skipped:
        scaler.scale((w * w).sum()).backward()
        if skip:
            with torch.no_grad():
                w.grad[0] = float("inf")
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        scales.append(scaler.get_scale())
    return scales


def close(a, b, limit=1e-6):
    return all(abs(x - y) <= limit * max(1.0, abs(y)) for x, y in zip(a, b)) and len(a) == len(b)


def graph_train(args, work):
    eager, _ = run_graph_job(args, work, "eager", GRAPH_STEPS.format(graph="false"), 1000)
    graphed, summary = run_graph_job(args, work, "graphed", GRAPH_STEPS.format(graph="true"), 1000)
    a, b = steps(eager), steps(graphed)
    worst = max(abs(x["loss"] - y["loss"]) for x, y in zip(a, b))
    ew, gw = weights(eager), weights(graphed)
    wdiff = max((ew[k].float() - gw[k].float()).abs().max().item() for k in ew)
    skipped = [s["skipped"] for s in b]
    expected = torch_scales(skipped)
    print(f"graphed vs eager over {len(b)} steps ({summary['cuda_graphs']} graphs): worst |loss diff| {worst:.2e}, "
          f"max |weight diff| {wdiff:.2e} (limits 1e-6); skipped steps {[s['step'] for s in b if s['skipped']]}")
    print("our scales:  ", [s["loss_scale"] for s in b])
    print("torch scales:", expected)
    ea, ga = epochs(eager)[-1], epochs(graphed)[-1]
    evals = [float(ga[k]) for k in ("eval_loss", "eval_acc")], [float(ea[k]) for k in ("eval_loss", "eval_acc")]
    print(f"evaluation: graphed {evals[0]}, eager {evals[1]}")
    check(close([s["loss"] for s in b], [s["loss"] for s in a]) and wdiff <= 1e-6 and len(b) == 20
          and close(*evals)
          and skipped == [s["skipped"] for s in a] and skipped[6] and sum(skipped) == 1
          and [s["loss_scale"] for s in b] == expected and summary["cuda_graphs"] >= 1,
          "graphed steps differ from eager ones in losses, weights, skips, scales or evaluation (the lines above)")


MASTER_STEPS = ("train:\n  batch_size: 16\n  max_steps: 20\n  epochs: 1\n  lr: 1.0e-3\n  max_grad_norm: 1.0\n"
                "  precision: bf16\n  cuda_graph: {graph}\n  bf16_weights: {masters}\n")


def relative_gap(a, b):
    """The worst relative difference between two runs' step losses."""
    return max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(a, b))


def graph_train_masters(args, work):
    import torch
    eager, _ = run_graph_job(args, work, "masters_eager", MASTER_STEPS.format(graph="false", masters="true"), 1000)
    graphed, summary = run_graph_job(args, work, "masters_graphed",
                                     MASTER_STEPS.format(graph="true", masters="true"), 1000)
    autocast, _ = run_graph_job(args, work, "autocast_graphed", MASTER_STEPS.format(graph="true", masters="false"),
                                1000)
    a, b, c = steps(eager), steps(graphed), steps(autocast)
    ew, gw = weights(eager), weights(graphed)
    wdiff = max((ew[k].float() - gw[k].float()).abs().max().item() for k in ew)
    query = "bert.encoder.layer.0.attention.self.query.weight"
    held = gw[query]
    beyond_bf16 = (held != held.to(torch.bfloat16).float()).float().mean().item()
    gap, follow = relative_gap(b, a), max(relative_gap(a, c), relative_gap(b, c))
    print(f"bf16 weights, graphed ({summary['cuda_graphs']} graphs) vs eager over {len(b)} steps: worst relative "
          f"loss difference {gap:.2e} (limit 1e-3), max |master diff| {wdiff:.2e} (limit 2e-3)")
    print(f"against the graphed autocast run: worst relative loss difference {follow:.2e} (limit 5e-3)")
    print(f"saved {query}: {held.dtype}, {100 * beyond_bf16:.1f}% of its values not representable in bf16")
    print("losses (graphed, bf16 weights):", [round(s["loss"], 5) for s in b])
    print("losses (graphed, autocast):    ", [round(s["loss"], 5) for s in c])
    check(len(a) == len(b) == len(c) == 20 and gap <= 1e-3 and wdiff <= 2e-3 and follow <= 5e-3
          and summary["cuda_graphs"] >= 1 and held.dtype == torch.float32 and beyond_bf16 > 0.5,
          "the graphed bf16-weights step is off the eager one or the autocast run, or saved no fp32 masters "
          "(the lines above)")


PACKED_STEPS = ("train:\n  batch_size: 16\n  max_steps: 20\n  epochs: 1\n  lr: 1.0e-3\n  precision: bf16\n"
                "  cuda_graph: {graph}\n")


def graph_train_packed(args, work):
    packed = "  unpad: always\n"
    padded, _ = run_graph_job(args, work, "padded_graphed", PACKED_STEPS.format(graph="true"), 1000)
    eager, _ = run_graph_job(args, work, "packed_eager", PACKED_STEPS.format(graph="false"), 1000, model=packed)
    graphed, summary = run_graph_job(args, work, "packed_graphed", PACKED_STEPS.format(graph="true"), 1000,
                                     model=packed)
    a, b, c = steps(eager), steps(graphed), steps(padded)
    gap, follow = relative_gap(b, a), max(relative_gap(a, c), relative_gap(b, c))
    times = {name: epochs(run)[-1]["ms_per_step"] for name, run in
             (("padded graphed", padded), ("packed eager", eager), ("packed graphed", graphed))}
    print(f"packed, graphed ({summary['cuda_graphs']} graphs) vs eager over {len(b)} steps: worst relative loss "
          f"difference {gap:.2e} (limit 1e-3); against the padded graphed run {follow:.2e} (limit 2e-2)")
    print("ms per step:", times)
    print("losses (packed, graphed):", [round(s["loss"], 5) for s in b])
    print("losses (padded, graphed):", [round(s["loss"], 5) for s in c])
    check(len(a) == len(b) == len(c) == 20 and gap <= 1e-3 and follow <= 2e-2 and summary["cuda_graphs"] > 1,
          "packed steps are off the eager or the padded ones, or were not graphed (the lines above)")


def graph_memory(args, work):
    text = "train:\n  batch_size: 16\n  max_steps: 200\n  epochs: 1\n  cuda_graph: true\n"
    run, summary = run_graph_job(args, work, "memory", text, 6000)
    rows = steps(run)
    seen, captured_at = {}, {}
    for row in rows:
        seen[row["padded_len"]] = seen.get(row["padded_len"], 0) + 1
        if seen[row["padded_len"]] == 2:
            captured_at[row["padded_len"]] = row["step"]
    last_capture = max(captured_at.values())
    after = [r["cuda_allocated_mb"] for r in rows if r["step"] >= last_capture]
    spread = max(after) - min(after)
    print(f"{summary['cuda_graphs']} graphs for padded lengths {sorted(captured_at)}; last captured at step "
          f"{last_capture}; memory in use after it: {min(after):.1f} to {max(after):.1f} MB over {len(after)} steps")
    check(len(rows) == 200 and summary["cuda_graphs"] >= 3 and len(after) >= 20 and spread <= 1.0,
          f"{len(rows)} steps, {summary['cuda_graphs']} graphs, memory moved by {spread:.1f} MB after the last capture")


def graph_nccl(args, work):
    check(args.mpirun, "graph_nccl needs --mpirun")
    eager, _ = run_graph_job(args, work, "eager", GRAPH_STEPS.format(graph="false"), 1000)
    text = GRAPH_STEPS.format(graph="true") + "distributed:\n  backend: nccl\n"
    graphed, summary = run_graph_job(args, work, "nccl", text, 1000, mpirun_ranks=1)
    a, b = steps(eager), steps(graphed)
    worst = max(abs(x["loss"] - y["loss"]) for x, y in zip(a, b))
    print(f"one NCCL rank, graphed, vs eager without a communicator over {len(b)} steps "
          f"({summary['cuda_graphs']} graphs): worst |loss diff| {worst:.2e} (limit 1e-6)")
    check(close([s["loss"] for s in b], [s["loss"] for s in a]) and summary["cuda_graphs"] >= 1 and len(b) == 20,
          "the NCCL rank's graphed losses are off the eager run's (the line above)")


def run_benchmark(args, work, name, text):
    """Runs the benchmark job `text` (named `name`); its benchmark.csv rows, or None if it failed."""
    job = write(os.path.join(work, name + ".yaml"), text)
    result = subprocess.run([args.worker, job, "--runs-dir", os.path.join(work, "runs")], capture_output=True,
                            text=True, timeout=900)
    if result.returncode != 0:
        print(result.stdout[-3000:], result.stderr[-3000:])
        return None
    with open(os.path.join(work, "runs", name, "benchmark.csv")) as f:
        return list(csv.DictReader(f))


def graph(args, work):
    import torch
    from model_parity import make_model, padded_inputs
    folder = os.path.join(work, "hf")
    make_model(folder)
    ids, mask = padded_inputs()
    inputs = write(os.path.join(work, "inputs.json"), json.dumps({"input_ids": ids.tolist(),
                                                                  "attention_mask": mask.tolist()}))
    out = json.loads(subprocess.run([args.probe, "graph", folder, inputs], capture_output=True, text=True,
                                    check=True).stdout)
    diff = (torch.tensor(out["graph"]) - torch.tensor(out["eager"])).abs().max().item()
    print(f"CUDA graph replay vs eager (fp32): max |logit diff| {diff:.2e} (limit 1e-5)")
    bench = f"""name: graph_cells
kind: benchmark
data:
  train: {LANGID}/train.tsv
  labels: {LANGID}/labels.txt
  tokenizer: {{vocab: {LANGID}/vocab.txt}}
model: {{preset: mini}}
runtime: {{device: cuda}}
benchmark:
  batch_sizes: [1, 8]
  seq_lens: [32, 128]
  precisions: [fp32, bf16, fp16]
  modes: [eager, cuda_graph]
  iters: 20
"""
    cells = run_benchmark(args, work, "graph_cells", bench)
    check(cells is not None, "the benchmark job failed (its output is above)")
    for c in cells:
        if c["mode"] == "cuda_graph":
            print(f"cuda_graph {c['precision']} b{c['batch']} s{c['seq_len']}: {c['status']} p50 {c['p50_ms']} ms")
    check(diff <= 1e-5 and len(cells) == 24 and all(c["status"] == "ok" for c in cells),
          "graph replays are off the eager logits, or a benchmark cell was not measured (the lines above)")


def generate(args, work):
    import torch
    from reference.generate_parity import EOS, hf_greedy, make_model, prompts
    torch.backends.cuda.matmul.allow_tf32 = False
    folder = os.path.join(work, "gpt2")
    model = make_model(folder).cuda()
    ok = True
    for batch in (1, 4):
        rows = prompts(batch)
        expected = hf_greedy(model, rows)  # HF on the same GPU
        got = {}
        for decode in ("growing", "graph"):
            path = write(os.path.join(work, f"generate_{decode}.json"),
                         json.dumps({"prompts": rows, "max_new_tokens": 32, "pad_id": EOS, "stop_ids": [EOS],
                                     "decode": decode}))
            out = subprocess.run([args.probe, "generate", folder, path, "--device", "cuda"], capture_output=True,
                                 text=True)
            check(out.returncode == 0, f"probe generate failed:\n{out.stderr[-2000:]}")
            got[decode] = json.loads(out.stdout)["tokens"]
        same_hf, same_graph = got["growing"] == expected, got["graph"] == got["growing"]
        print(f"batch {batch}: greedy on CUDA vs HF generate: {same_hf}; CUDA-graph decode vs growing: {same_graph}")
        ok = ok and same_hf and same_graph
    lm = os.path.join(os.path.dirname(LANGID), "lm")
    bench = f"""name: generate_cells
kind: benchmark
task: causal_lm
data:
  train: {lm}/train.txt
  tokenizer: {{kind: bpe, vocab: {lm}/bpe/vocab.json, merges: {lm}/bpe/merges.txt}}
model: {{family: gpt2, preset: mini}}
runtime: {{device: cuda}}
benchmark:
  mode: generate
  batch_sizes: [1, 8]
  seq_lens: [32, 128]
  precisions: [fp32, bf16, fp16]
  modes: [eager, cuda_graph]
  new_tokens: 32
  iters: 5
"""
    cells = run_benchmark(args, work, "generate_cells", bench)
    check(cells is not None, "the benchmark job failed (its output is above)")
    for c in cells:
        print(f"{c['mode']} {c['precision']} b{c['batch']} prompt {c['seq_len']}: {c['status']} first token "
              f"{c['first_token_ms']} ms, {c['tokens_per_s']} tok/s")
    check(ok and len(cells) == 24 and all(c["status"] == "ok" for c in cells),
          "greedy CUDA tokens differ from HF's or between decodes, or a benchmark cell was not measured "
          "(the lines above)")


def on_cuda(case):
    """`case`, skipped (exit 77) where torch sees no CUDA device."""
    def run(args, work):
        require_cuda()
        case(args, work)
    return run


CASES = {case.__name__: on_cuda(case) for case in (parity, train, graph, generate, graph_train, graph_train_masters,
                                                   graph_train_packed,
                                                   graph_memory, graph_nccl)}


if __name__ == "__main__":
    run_case(CASES, ("--probe", "--worker"), __doc__,
             options=lambda p: p.add_argument("--mpirun", help="Open MPI's mpirun (graph_nccl)"))
