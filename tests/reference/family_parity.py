#!/usr/bin/env python3
"""Model-family parity: for each family, Hugging Face saves a randomly initialised model
(2+ layers) with save_pretrained; our fp32 logits on the same padded inputs are HF's to
within the rounding HF's own fp32 forward makes against the same model in float64
(tests/harness/bounds.py); and the folder we save back loads in transformers with the
same logits.

Cases:
  roberta      RobertaForSequenceClassification, right padding, ids drawn around pad=1
  distilbert   DistilBertForSequenceClassification, right padding
  gpt2_lm      GPT2LMHeadModel, logits [B, S, V] compared at real positions
  gpt2_cls     GPT2ForSequenceClassification with pad_token_id, right and left padding
  gpt2_legacy  an LM checkpoint without the "transformer." prefix and with the attn.bias /
               attn.masked_bias buffers old checkpoints carry, and one with an explicit
               lm_head.weight: both load
--precision bf16 runs both sides under bf16 autocast instead, and compares by relative L2
error (bf16 keeps 8 bits of mantissa, so an elementwise float32 bound is not the measure).
"""
import json
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import (AutoModelForCausalLM, AutoModelForSequenceClassification, DistilBertConfig,
                          DistilBertForSequenceClassification, GPT2Config, GPT2ForSequenceClassification,
                          GPT2LMHeadModel, RobertaConfig, RobertaForSequenceClassification)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_case  # noqa: E402
from harness.bounds import in_float64, within_rounding_of  # noqa: E402

VOCAB = 300


def spread(model):
    """HF's N(0, 0.02) init makes every logit ~0; larger weights make the check bite."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" not in name and "layer_norm" not in name and ".ln_" not in name and "ln_f" not in name:
                p.normal_(0.0, 0.15)
    return model.eval()


def make(case):
    torch.manual_seed(0)
    if case == "roberta":
        config = RobertaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                               intermediate_size=128, max_position_embeddings=40 + 2, type_vocab_size=1,
                               layer_norm_eps=1e-5, num_labels=5, pad_token_id=1, bos_token_id=0, eos_token_id=2)
        return spread(RobertaForSequenceClassification(config)), 1
    if case == "distilbert":
        config = DistilBertConfig(vocab_size=VOCAB, dim=64, n_layers=3, n_heads=4, hidden_dim=128,
                                  max_position_embeddings=40, num_labels=5)
        return spread(DistilBertForSequenceClassification(config)), 0
    gpt2 = dict(vocab_size=VOCAB, n_embd=64, n_layer=3, n_head=4, n_positions=40, bos_token_id=VOCAB - 1,
                eos_token_id=VOCAB - 1)
    if case == "gpt2_cls":
        config = GPT2Config(**gpt2, pad_token_id=VOCAB - 1, num_labels=5)
        return spread(GPT2ForSequenceClassification(config)), VOCAB - 1
    return spread(GPT2LMHeadModel(GPT2Config(**gpt2))), VOCAB - 1


def padded_inputs(pad, left=False):
    """Rows of several lengths; real ids avoid the pad id (RoBERTa and GPT-2 find padding by id)."""
    g = torch.Generator().manual_seed(1)
    lengths = [40, 7, 23, 1, 33, 12]
    ids = torch.full((len(lengths), max(lengths)), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        real = torch.randint(3, VOCAB - 1, (n,), generator=g)
        real[real == pad] = pad + 1
        where = slice(ids.shape[1] - n, None) if left else slice(0, n)
        ids[row, where] = real
        mask[row, where] = 1
    return ids, mask


PRECISION = "fp32"
BF16_RELATIVE_L2 = 2e-2


def our_logits(probe, folder, ids, mask, work):
    path = os.path.join(work, "inputs.json")
    with open(path, "w") as f:
        json.dump({"input_ids": ids.tolist(), "attention_mask": mask.tolist()}, f)
    out = subprocess.run([probe, "logits", folder, path, "--precision", PRECISION], capture_output=True, text=True)
    check(out.returncode == 0, f"probe logits failed: {out.stderr.strip()}")
    return torch.tensor(json.loads(out.stdout)["logits"])


def hf_logits(model, ids, mask):
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=PRECISION == "bf16"):
        return model(input_ids=ids, attention_mask=mask).logits.float()


def exact_logits(model, ids, mask):
    """HF's logits with the model in float64: the exact values the fp32 sides round."""
    with torch.no_grad():
        return in_float64(model)(input_ids=ids, attention_mask=mask).logits


def compare(name, ours, expected, mask, exact=None):
    """fp32: ours within the rounding of HF's fp32 against `exact` (HF in float64); bf16:
    relative L2. A causal LM's [B, S, V] logits are compared where the mask is 1."""
    if expected.dim() == 3:
        keep = mask.bool()
        ours, expected = ours[keep], expected[keep]
        exact = exact[keep] if exact is not None else None
    diff = (ours - expected).abs().max().item()
    scale = expected.abs().max().item()
    if PRECISION == "bf16":
        relative = ((ours - expected).norm() / expected.norm()).item()
        print(f"{name}: bf16 relative L2 error {relative:.3e} (max |diff| {diff:.3e}, logit scale {scale:.2f})")
        return relative < BF16_RELATIVE_L2 and scale > 0.5
    close, detail = within_rounding_of(ours, expected, exact)
    print(f"{name}: {detail}; max |logit diff| from HF {diff:.3e}")
    return close and scale > 0.5


def reload(folder, causal):
    cls = AutoModelForCausalLM if causal else AutoModelForSequenceClassification
    return cls.from_pretrained(folder).eval()


def legacy_folders(hf_dir, work):
    """The same LM weights as old and explicit-head checkpoints write them."""
    tensors = load_file(os.path.join(hf_dir, "model.safetensors"))
    config = open(os.path.join(hf_dir, "config.json")).read()
    bare = {k[len("transformer."):]: v for k, v in tensors.items()}
    n_layer, positions = 3, 40
    for i in range(n_layer):
        bare[f"h.{i}.attn.bias"] = torch.tril(torch.ones(positions, positions, dtype=torch.uint8)).view(
            1, 1, positions, positions)
        bare[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    explicit = dict(tensors)
    explicit["lm_head.weight"] = tensors["transformer.wte.weight"].clone()
    folders = []
    for name, content in (("bare_with_buffers", bare), ("explicit_lm_head", explicit)):
        folder = os.path.join(work, name)
        os.makedirs(folder)
        save_file(content, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(folder, "config.json"), "w") as f:
            f.write(config)
        folders.append((name, folder))
    return folders


def run(case, probe, work):
    model, pad = make("gpt2_lm" if case == "gpt2_legacy" else case)
    causal = isinstance(model, GPT2LMHeadModel)
    hf_dir = os.path.join(work, "hf")
    model.save_pretrained(hf_dir, safe_serialization=True)
    ok = True
    for left in ((False, True) if case == "gpt2_cls" else (False,)):
        ids, mask = padded_inputs(pad, left)
        expected = hf_logits(model, ids, mask)
        exact = exact_logits(model, ids, mask) if PRECISION == "fp32" else None
        side = "left" if left else "right"
        if case == "gpt2_legacy":
            for name, folder in legacy_folders(hf_dir, work):
                ok &= compare(f"{name} -> ours", our_logits(probe, folder, ids, mask, work), expected, mask, exact)
            continue
        ok &= compare(f"HF -> ours ({side} padding)", our_logits(probe, hf_dir, ids, mask, work), expected, mask,
                      exact)
        if PRECISION == "bf16":
            continue
        resaved = os.path.join(work, f"ours_{side}")
        subprocess.run([probe, "resave", hf_dir, resaved], check=True)
        back = hf_logits(reload(resaved, causal), ids, mask)
        diff_back = (back - expected).abs().max().item()
        print(f"ours -> HF ({side} padding): max |logit diff| = {diff_back:.3e}")
        ok &= diff_back == 0.0
    return ok


def family(case):
    """The run_case() case of `case`, at the command line's --precision."""
    def run_family(args, work):
        global PRECISION
        PRECISION = args.precision
        check(run(case, args.probe, work), f"{case}: logits are off HF's, or lost on the way back (the lines above)")
    return run_family


CASES = {case: family(case) for case in ("roberta", "distilbert", "gpt2_lm", "gpt2_cls", "gpt2_legacy")}


if __name__ == "__main__":
    run_case(CASES, ("--probe",), __doc__,
             options=lambda p: p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32"))
