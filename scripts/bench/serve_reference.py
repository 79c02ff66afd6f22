"""The reference serving stack for scripts/bench/serve_load.sh: MLServer (Seldon's Python
server for the same Open Inference Protocol, HTTP and gRPC) with adaptive batching on,
running the Hugging Face classifier with its own tokenizer. MLServer imports this file as
the model's runtime (model-settings.json: "implementation": "serve_reference.HfClassifier").
"""
import os

import numpy as np
import torch
from mlserver import MLModel
from mlserver.codecs import NumpyCodec, StringCodec
from mlserver.types import InferenceRequest, InferenceResponse
from transformers import AutoModelForSequenceClassification, BertTokenizerFast


class HfClassifier(MLModel):
    async def load(self) -> bool:
        torch.set_num_threads(int(os.environ.get("SERVE_REFERENCE_THREADS", "1")))
        folder = self.settings.parameters.uri
        self.tokenizer = BertTokenizerFast(os.path.join(folder, "vocab.txt"), do_lower_case=True)
        self.model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
        self.labels = [self.model.config.id2label[i] for i in range(self.model.config.num_labels)]
        self.max_length = self.model.config.max_position_embeddings
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        texts = StringCodec.decode_input(payload.inputs[0])
        encoded = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length,
                                 return_tensors="pt")
        with torch.inference_mode():
            logits = self.model(**encoded).logits.float().numpy()
        labels = [self.labels[i] for i in logits.argmax(1)]
        return InferenceResponse(model_name=self.name, outputs=[
            NumpyCodec.encode_output("logits", logits.astype(np.float32)),
            StringCodec.encode_output("label", labels)])
