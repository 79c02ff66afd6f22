#!/usr/bin/env python3
"""LoRA parity with PEFT (peft 0.21), for one case:
  roberta     RobertaForSequenceClassification, PEFT's default targets (query, value), SEQ_CLS
  distilbert  DistilBertForSequenceClassification, targets q_lin and v_lin as PEFT's regex
              string form (PEFT has no default): each side reads the other's
  gpt2        GPT2LMHeadModel, c_attn (Conv1D, fan_in_fan_out), rsLoRA
Checked:
  - step parity: the same base weights and PEFT's initial adapter, the same batches, 20
    AdamW steps on each side; every adapter tensor of ours is within the rounding PEFT's
    own fp32 steps make against the same 20 steps in float64 (tests/harness/bounds.py);
  - our trainable parameter count equals PEFT's get_nb_trainable_parameters();
  - PeftModel.from_pretrained loads our adapter and gives our logits; we load PEFT's
    trained adapter and give its logits;
  - the merged folder we write loads as a plain HF model with the unmerged logits.
Each pair of logits is held the same way: the fp32 result against the float64 one, within
the rounding of the fp32 reference beside it."""
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_case, skip  # noqa: E402
from harness.bounds import in_float64, within_rounding_of  # noqa: E402
try:
    from peft import LoraConfig, PeftModel, get_peft_model
except ImportError:
    # A missing reference must not read as a pass: only a machine that cannot have peft
    # (the GPU box's bare python, scripts/gpu/build_and_test.sh) says so, and skips.
    if os.environ.get("TRAINYARD_TESTS_WITHOUT_PEFT") == "1":
        skip("the peft package is not installed (TRAINYARD_TESTS_WITHOUT_PEFT=1)")
    raise AssertionError("the peft package is not installed; scripts/setup.sh puts it in the venv "
                         "(TRAINYARD_TESTS_WITHOUT_PEFT=1 skips this test where it cannot be had)")
from safetensors.torch import load_file  # noqa: E402
from transformers import (DistilBertConfig, DistilBertForSequenceClassification, GPT2Config, GPT2LMHeadModel,
                          RobertaConfig, RobertaForSequenceClassification)

VOCAB, STEPS, LR, DECAY = 200, 20, 5e-3, 0.01


def base_model(case):
    torch.manual_seed(0)
    if case == "roberta":
        config = RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=64, max_position_embeddings=40, type_vocab_size=1, num_labels=3,
                               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        return RobertaForSequenceClassification(config), dict(task_type="SEQ_CLS", r=4, lora_alpha=8)
    if case == "distilbert":
        config = DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                  max_position_embeddings=40, num_labels=3, dropout=0.0, attention_dropout=0.0,
                                  seq_classif_dropout=0.0)
        return DistilBertForSequenceClassification(config), dict(task_type="SEQ_CLS", r=4, lora_alpha=8,
                                                                  target_modules=r".*\.(q_lin|v_lin)")
    config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=40, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    return GPT2LMHeadModel(config), dict(task_type="CAUSAL_LM", r=4, lora_alpha=16, target_modules=["c_attn"],
                                         use_rslora=True)


def batches(case, pad):
    g = torch.Generator().manual_seed(4)
    out = []
    for _ in range(STEPS):
        lengths = torch.randint(4, 24, (4,), generator=g).tolist()
        ids = torch.full((4, max(lengths)), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, n in enumerate(lengths):
            ids[row, :n] = torch.randint(3, VOCAB - 2, (n,), generator=g)
            mask[row, :n] = 1
        out.append({"input_ids": ids, "attention_mask": mask, "labels": torch.randint(0, 3, (4,), generator=g)})
    return out


def peft_steps(model, data, causal):
    """HF Trainer's grouping, which our AdamW follows: decay on tensors of dim >= 2."""
    trained = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in trained if p.dim() >= 2], "weight_decay": DECAY},
              {"params": [p for p in trained if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.999), eps=1e-8)
    model.train()
    for b in data:
        if causal:
            labels = b["input_ids"].masked_fill(b["attention_mask"] == 0, -100)
            loss = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=labels).loss
        else:
            loss = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()


def logits(model, b):
    with torch.no_grad():
        return model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits


def probe(args, *argv):
    run = subprocess.run([args.probe, *argv], capture_output=True, text=True)
    check(run.returncode == 0, f"probe {argv[0]} failed: {run.stderr.strip()[-2000:]}")
    return json.loads(run.stdout) if run.stdout.strip() else None


def our_logits(args, work, model_dir, b, adapter=None):
    path = os.path.join(work, "inputs.json")
    with open(path, "w") as f:
        json.dump({"input_ids": b["input_ids"].tolist(), "attention_mask": b["attention_mask"].tolist()}, f)
    extra = ["--adapter", adapter] if adapter else []
    return torch.tensor(probe(args, "logits", model_dir, path, *extra)["logits"])


def close(name, candidate, baseline, exact):
    """The fp32 candidate within the rounding of the fp32 baseline against `exact`."""
    ok, detail = within_rounding_of(candidate, baseline, exact)
    print(f"{name}: {detail}; max |diff| {(candidate.double() - baseline.double()).abs().max().item():.3e}")
    return ok


def test(args, work):
    """The case args.case: one family's LoRA against PEFT's."""
    base, lora = base_model(args.case)
    causal = args.case == "gpt2"
    pad = 1 if args.case == "roberta" else (VOCAB - 1 if causal else 0)
    data = batches(args.case, pad)
    ok = True
    base_dir, start, theirs, ours = (os.path.join(work, d) for d in ("base", "start", "peft", "ours"))
    base.save_pretrained(base_dir, safe_serialization=True)
    peft_model = get_peft_model(base, LoraConfig(lora_dropout=0.0, **lora))
    with torch.no_grad():  # B starts at zero in PEFT; a random B makes step 1 move A too
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    peft_model.save_pretrained(start)
    trainable = peft_model.get_nb_trainable_parameters()[0]
    exact_model = in_float64(peft_model)  # the same steps in float64, for the bounds

    steps_file = os.path.join(work, "steps.json")
    with open(steps_file, "w") as f:
        json.dump({"lr": LR, "weight_decay": DECAY,
                   "batches": [{k: v.tolist() for k, v in b.items()} for b in data]}, f)
    report = probe(args, "lora-steps", base_dir, start, steps_file, ours)
    print(f"trainable parameters: ours {report['trainable']}, PEFT {trainable}; "
          f"{len(report['adapted'])} layers adapted, e.g. {report['adapted'][0]}")
    ok &= report["trainable"] == trainable

    peft_steps(peft_model, data, causal)
    peft_model.save_pretrained(theirs)
    peft_steps(exact_model, data, causal)
    exact_dir = os.path.join(work, "exact")
    exact_model.save_pretrained(exact_dir)
    mine, reference, exact = (load_file(os.path.join(folder, "adapter_model.safetensors"))
                              for folder in (ours, theirs, exact_dir))
    same_keys = sorted(mine) == sorted(reference) == sorted(exact)
    worst = max((mine[k] - reference[k]).abs().max().item() for k in reference if k in mine)
    moved = max((reference[k] - load_file(os.path.join(start, "adapter_model.safetensors"))[k]).abs().max().item()
                for k in reference)
    print(f"after {STEPS} AdamW steps: {len(reference)} adapter tensors, same names: {same_keys}, "
          f"max |ours - PEFT| = {worst:.3e} (the adapter moved by up to {moved:.3e})")
    bounded = same_keys
    for index, key in enumerate(sorted(reference) if same_keys else []):
        within, detail = within_rounding_of(mine[key], reference[key], exact[key])
        if not within or index == 0:
            print(f"  {key}: {detail}")
        bounded &= within
    ok &= bounded and moved > 1e-3

    probe_batch = data[0]
    peft_logits = logits(peft_model, probe_batch)
    peft_exact = logits(in_float64(peft_model), probe_batch)
    reloaded = PeftModel.from_pretrained(type(base).from_pretrained(base_dir), ours).eval()
    keep = probe_batch["attention_mask"].bool() if causal else slice(None)
    ok &= close("PEFT loads our adapter: our logits vs its",
                our_logits(args, work, base_dir, probe_batch, ours)[keep], logits(reloaded, probe_batch)[keep],
                logits(in_float64(reloaded), probe_batch)[keep])
    ok &= close("we load PEFT's adapter: our logits vs PEFT's",
                our_logits(args, work, base_dir, probe_batch, theirs)[keep], peft_logits[keep], peft_exact[keep])
    merged = os.path.join(work, "merged")
    probe(args, "merge", base_dir, theirs, merged)
    plain = type(base).from_pretrained(merged).eval()
    ok &= close("merged folder (plain HF) vs PEFT unmerged", logits(plain, probe_batch)[keep], peft_logits[keep],
                peft_exact[keep])
    check(ok, "our LoRA steps, adapters or merged folder are off PEFT's (the lines above)")


if __name__ == "__main__":
    run_case({"roberta": test, "distilbert": test, "gpt2": test}, ("--probe",), __doc__)
