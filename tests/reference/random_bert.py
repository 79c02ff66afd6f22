"""The random BERT classifier the parity tests compare on: seeded, every weight but the
LayerNorms drawn from N(0, std) (larger than HF's 0.02, so the logits spread enough for a
difference to show), saved as a Hugging Face folder."""
import torch
from transformers import BertConfig, BertForSequenceClassification


def save_random_bert(hf_dir, vocab_size, hidden_size, num_attention_heads, intermediate_size, std, **config):
    """Saves the model into hf_dir and returns it in eval mode. `config` adds BertConfig
    fields (the defaults: 2 layers, 128 positions, 9 labels)."""
    torch.manual_seed(0)
    config = BertConfig(vocab_size=vocab_size, hidden_size=hidden_size, num_attention_heads=num_attention_heads,
                        intermediate_size=intermediate_size,
                        **{"num_hidden_layers": 2, "max_position_embeddings": 128, "num_labels": 9, **config})
    model = BertForSequenceClassification(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" not in name:
                p.normal_(0.0, std)
    model.save_pretrained(hf_dir, safe_serialization=True)
    return model
