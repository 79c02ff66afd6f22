#!/usr/bin/env python3
"""Makes an AOTInductor package (.pt2) from a Hugging Face sequence-classification folder
(BERT, RoBERTa, DistilBERT or GPT-2, as the worker writes them to runs/<name>/model), for
the `aoti` mode of benchmark and inference jobs.

The package takes (input_ids, attention_mask), both int64 [batch, seq], and returns the
logits [batch, labels]. Batch and sequence length are dynamic, from 1 to --max-batch and
to --max-seq (default: the model's position limit). It is compiled for this machine: its
kernels use this CPU's vector instructions (or target the GPU with --device cuda) and this
torch version's ABI. The package records both in its metadata, and the worker refuses a
package made for another torch version or for vector instructions its CPU lacks.

  venv/bin/python scripts/export_aoti.py --model runs/langid_tiny/model --out langid.pt2

Compiling takes a minute or more on two cores."""
import argparse
import os
import sys
import time

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification


class Logits(torch.nn.Module):
    """The classifier with the calling convention the worker uses: two tensors in, one out."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask)
        return out[0] if isinstance(out, tuple) else out.logits  # tuples: a config with torchscript=True


def max_positions(config):
    for key in ("max_position_embeddings", "n_positions"):
        if getattr(config, key, None):
            # RoBERTa's table starts after the padding index.
            return getattr(config, key) - (config.pad_token_id + 1 if config.model_type == "roberta" else 0)
    return 512


def vector_isa():
    from torch._inductor import cpu_vec_isa
    return str(cpu_vec_isa.pick_vec_isa()) or "none"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--model", required=True, help="Hugging Face folder (config.json + weights)")
    p.add_argument("--out", required=True, help="the package to write (.pt2)")
    p.add_argument("--max-batch", type=int, default=256)
    p.add_argument("--max-seq", type=int, default=0, help="default: the model's position limit")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    a = p.parse_args()
    if not a.out.endswith(".pt2"):
        p.error(f"--out {a.out}: the package name must end in .pt2")
    if not os.path.isfile(os.path.join(a.model, "config.json")):
        p.error(f"--model {a.model}: no config.json there (expected a Hugging Face folder)")
    config = AutoConfig.from_pretrained(a.model)
    max_seq = a.max_seq or max_positions(config)
    if not 2 <= max_seq <= max_positions(config):
        p.error(f"--max-seq {max_seq}: must be from 2 to the model's position limit {max_positions(config)}")
    if a.max_batch < 2:
        p.error("--max-batch: must be at least 2")
    model = AutoModelForSequenceClassification.from_pretrained(a.model).eval().to(a.device)
    ids = torch.ones((2, min(16, max_seq)), dtype=torch.long, device=a.device)
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0  # a padded row, so the mask is not folded away
    batch = torch.export.Dim("batch", min=1, max=a.max_batch)
    seq = torch.export.Dim("seq", min=1, max=max_seq)
    start = time.time()
    with torch.no_grad():
        program = torch.export.export(Logits(model), (ids, mask),
                                      dynamic_shapes={"input_ids": {0: batch, 1: seq},
                                                      "attention_mask": {0: batch, 1: seq}})
        metadata = {"trainyard_torch_version": torch.__version__.split("+")[0],
                    "trainyard_device": a.device,
                    "trainyard_vec_isa": vector_isa() if a.device == "cpu" else "none",
                    "trainyard_max_batch": str(a.max_batch), "trainyard_max_seq": str(max_seq),
                    "trainyard_labels": str(config.num_labels)}
        path = torch._inductor.aoti_compile_and_package(
            program, package_path=a.out, inductor_configs={"aot_inductor.metadata": metadata})
    print(f"wrote {path} ({os.path.getsize(path) / 1048576:.1f} MiB) in {time.time() - start:.0f} s: "
          f"batch 1..{a.max_batch}, seq 1..{max_seq}, {a.device}, vector ISA {metadata['trainyard_vec_isa']}, "
          f"torch {metadata['trainyard_torch_version']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
