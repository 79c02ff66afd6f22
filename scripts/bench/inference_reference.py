#!/usr/bin/env python3
"""The PyTorch side of inference_vs_pytorch.sh. `prepare` makes the shared weights (an
HF folder), a traced TorchScript file and, with --with-onnx, an ONNX file (model.onnx,
dynamic batch and length, exported by torch.onnx); `time` measures HF BertForSequenceClassification eager
on exactly the inputs the worker builds (the same token stream, cut the same way), on
CPU (wall clock) or CUDA (CUDA events per call, read at the end of each cell), in fp32 or
under bf16/fp16 autocast, and with --onnx ONNX Runtime's CPU session on the same inputs
and thread count; prints {"pytorch": {"BxS": mean ms per batch}, "onnxruntime": {...}}."""
import argparse
import csv
import json
import time

import torch
from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

PRESETS = {"tiny": (128, 2, 2, 512), "mini": (256, 4, 4, 1024), "base": (768, 12, 12, 3072)}


class LogitsTuple(torch.nn.Module):
    """The model with a (logits,) output: transformers 5 returns a dict even under
    torchscript=True, which torch.jit.trace refuses, and the worker reads element 0."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return (self.model(input_ids=input_ids, attention_mask=attention_mask)[0],)


def prepare(a):
    tok = BertTokenizer(a.vocab, do_lower_case=True)
    hidden, layers, heads, inter = PRESETS[a.preset]
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=inter, num_labels=9, torchscript=True)
    model = BertForSequenceClassification(config).eval()
    model.save_pretrained(a.out, safe_serialization=True)
    ids = torch.randint(5, tok.vocab_size, (2, 16))
    torch.jit.trace(LogitsTuple(model), (ids, torch.ones_like(ids))).save(a.out + "/traced.pt")
    if not a.with_onnx:
        return
    with torch.no_grad():
        torch.onnx.export(model, (ids, torch.ones_like(ids)), a.out + "/model.onnx", dynamo=True,
                          input_names=["input_ids", "attention_mask"], output_names=["logits"],
                          dynamic_shapes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}})


def token_stream(a, tok):
    """The worker's benchmark inputs: texts of data.train tokenized in file order,
    [CLS]/[SEP] dropped, concatenated up to 200,000 tokens."""
    stream = []
    with open(a.data, encoding="utf-8") as f:
        for row in list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]:
            text = row[1].replace("\\n", "\n").replace("\\t", "\t").replace("\\\\", "\\")
            stream += tok(text, add_special_tokens=False)["input_ids"]
            if len(stream) >= 200000:
                break
    return stream


def inputs(stream, cls, sep, batch, seq):
    body = max(0, seq - 2)
    span = len(stream) - body
    ids = torch.empty(batch, seq, dtype=torch.long)
    for r in range(batch):
        offset = (r * 7919 * max(body, 1)) % max(span, 1)
        ids[r] = torch.tensor([cls] + stream[offset:offset + body] + [sep])
    return ids


def time_calls(call, iters, cuda):
    if not cuda:
        ms = []
        for _ in range(iters):
            start = time.perf_counter()
            call()
            ms.append((time.perf_counter() - start) * 1000)
        return ms
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    torch.cuda.synchronize()
    for start, end in events:
        start.record()
        call()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events]


def time_cells(a):
    torch.set_num_threads(a.threads)
    tok = BertTokenizer(a.vocab, do_lower_case=True)
    model = BertForSequenceClassification.from_pretrained(a.model).eval().to(a.device)
    stream = token_stream(a, tok)
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[a.precision]
    results, ort_results = {}, {}
    session = None
    if a.onnx:
        import onnxruntime
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = a.threads, 1
        session = onnxruntime.InferenceSession(a.onnx, options, providers=["CPUExecutionProvider"])
    with torch.no_grad(), torch.autocast(a.device, dtype=dtype or torch.float32, enabled=dtype is not None):
        for batch in a.batches:
            for seq in a.seqs:
                if seq > model.config.max_position_embeddings:
                    continue
                ids = inputs(stream, tok.cls_token_id, tok.sep_token_id, batch, seq).to(a.device)
                mask = torch.ones_like(ids)
                call = lambda: model(input_ids=ids, attention_mask=mask)  # noqa: E731
                for _ in range(a.warmup):
                    call()
                ms = time_calls(call, a.iters, a.device == "cuda")
                results[f"{batch}x{seq}"] = sum(ms) / len(ms)
                if session:
                    feed = {"input_ids": ids.cpu().numpy(), "attention_mask": mask.cpu().numpy()}
                    run = lambda: session.run(["logits"], feed)  # noqa: E731
                    for _ in range(a.warmup):
                        run()
                    ms = time_calls(run, a.iters, False)
                    ort_results[f"{batch}x{seq}"] = sum(ms) / len(ms)
    print(json.dumps({"pytorch": results, "onnxruntime": ort_results}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["prepare", "time"])
    p.add_argument("--vocab", required=True)
    p.add_argument("--data")
    p.add_argument("--model")
    p.add_argument("--out")
    p.add_argument("--preset", default="mini")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--seqs", type=int, nargs="+", default=[32, 128])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32")
    p.add_argument("--onnx", default="", help="time: also time this ONNX file in ONNX Runtime (CPU)")
    p.add_argument("--with-onnx", action="store_true", help="prepare: also export model.onnx")
    a = p.parse_args()
    prepare(a) if a.command == "prepare" else time_cells(a)


if __name__ == "__main__":
    main()
