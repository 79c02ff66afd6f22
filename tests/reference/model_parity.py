#!/usr/bin/env python3
"""Model parity: our BERT's logits equal Hugging Face BertForSequenceClassification's on
the same model.safetensors and the same padded inputs, in fp32 to within the rounding HF's
own fp32 forward makes against the same model in float64 (tests/harness/bounds.py), and
a model saved by us loads in transformers with the same logits."""
import json
import os
import subprocess
import sys

import torch
from transformers import BertConfig, BertForSequenceClassification

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_test  # noqa: E402
from harness.bounds import in_float64, within_rounding_of  # noqa: E402


def make_model(folder):
    torch.manual_seed(0)
    config = BertConfig(vocab_size=300, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=40, num_labels=5)
    model = BertForSequenceClassification(config).eval()
    # HF's N(0, 0.02) init makes every logit ~0; larger weights make the check bite.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" not in name:
                p.normal_(0.0, 0.15)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def padded_inputs():
    g = torch.Generator().manual_seed(1)
    lengths = [40, 7, 23, 1, 33, 12]
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(1, 300, (n,), generator=g)
        mask[row, :n] = 1
    return ids, mask


def our_logits(probe, folder, ids, mask, work):
    path = os.path.join(work, "inputs.json")
    with open(path, "w") as f:
        json.dump({"input_ids": ids.tolist(), "attention_mask": mask.tolist()}, f)
    out = subprocess.run([probe, "logits", folder, path], capture_output=True, text=True, check=True)
    return torch.tensor(json.loads(out.stdout)["logits"])


def test(args, work):
    hf_dir = os.path.join(work, "hf")
    model = make_model(hf_dir)
    ids, mask = padded_inputs()
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits
        exact = in_float64(model)(input_ids=ids, attention_mask=mask).logits
    ours = our_logits(args.probe, hf_dir, ids, mask, work)
    close, detail = within_rounding_of(ours, expected, exact)
    print(f"HF -> ours: {detail}; max |logit diff| from HF {(ours - expected).abs().max().item():.3e}")

    resaved = os.path.join(work, "ours")
    subprocess.run([args.probe, "resave", hf_dir, resaved], check=True)
    reloaded = BertForSequenceClassification.from_pretrained(resaved).eval()
    with torch.no_grad():
        back = reloaded(input_ids=ids, attention_mask=mask).logits
    diff_back = (back - expected).abs().max().item()
    print(f"ours -> HF: max |logit diff| = {diff_back:.3e}")
    check(close and diff_back == 0.0 and expected.abs().max().item() >= 0.5,
          f"HF -> ours within its rounding {close}, ours -> HF exact {diff_back == 0.0}, logit scale "
          f"{expected.abs().max().item():.2f} (0.5 at least)")


if __name__ == "__main__":
    run_test(test, ("--probe",), __doc__)
