"""Regenerate the example models' committed weight files (deterministic; run from anywhere).

    python examples/models/make_weights.py

The numpy toys' files are small (a few KiB); each model tiles its file across the weights
region the agent gives it (32 MiB for `mlp`, 64 MiB for `tinylm`), so every byte of the
region is meaningful and a checksum of the whole region proves none was lost in a swap.

`tinyllama` is a Hugging Face folder (examples/models/tinyllama/1/hf): a Llama-architecture
`LlamaForCausalLM` whose parameters are drawn from numpy's generator with a fixed seed
(never from torch's, whose streams may differ between CPUs and versions), written as
safetensors, with a byte-level tokenizer built here with the `tokenizers` library and a
chat template. Nothing is downloaded. With the versions pinned in constraints.txt every
file comes out byte for byte as committed (tests/integration/test_example_tinyllama.py
checks it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

HERE = Path(__file__).resolve().parent

# Shapes; keep in step with each config.pbtxt's parameters and reference.py.
MLP_SIZES = (16, 64, 8)
TINYLM_VOCAB = 64
TINYLM_DIM = 16

TINYLLAMA_DIR = HERE / "tinyllama" / "1" / "hf"
TINYLLAMA_SEED = 25
#: Standard deviation of every matrix. Larger than Llama's usual 0.02 initialisation, so
#: the logits spread (top tokens rarely near a tie) and the answer depends on the whole
#: context, not only on the last byte.
TINYLLAMA_STD = 0.1
#: Token ids: byte b is id b; then the two special tokens.
BOS, EOS = "<s>", "</s>"
BOS_ID, EOS_ID = 256, 257
#: Renders exactly what the gateway's OpenAI chat route sends as text_input (one
#: `role: content` line per message, then `assistant:`), with the BOS the tokenizer adds,
#: so `apply_chat_template(..., add_generation_prompt=True)` gives the served model's ids.
#: (The newlines are Jinja expressions: transformers renders with trim_blocks, which drops
#: a newline written right after a block tag.)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}{% if not loop.last %}{{ '\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '\\nassistant:' }}{% endif %}"
)
TINYLLAMA_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 258,
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 4096,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "rms_norm_eps": 1e-05,
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "mlp_bias": False,
    "tie_word_embeddings": True,
    "initializer_range": TINYLLAMA_STD,
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
    "pad_token_id": EOS_ID,
    "dtype": "float32",
    "use_cache": True,
}


def mlp_weights(seed: int = 7) -> bytes:
    rng = np.random.default_rng(seed)
    n_in, n_hidden, n_out = MLP_SIZES
    parts = [
        rng.standard_normal((n_in, n_hidden)) / np.sqrt(n_in),
        rng.standard_normal(n_hidden) * 0.1,
        rng.standard_normal((n_hidden, n_out)) / np.sqrt(n_hidden),
        rng.standard_normal(n_out) * 0.1,
    ]
    return b"".join(p.astype("<f4").tobytes() for p in parts)


def tinylm_weights(seed: int = 11) -> bytes:
    rng = np.random.default_rng(seed)
    v, d = TINYLM_VOCAB, TINYLM_DIM
    parts = [rng.integers(-8, 9, size=shape) for shape in ((v, d), (d, d), (d, d), (d, d), (d, v))]
    return b"".join(p.astype("<i4").tobytes() for p in parts)


# -- tinyllama ---------------------------------------------------------------------------


def tinyllama_tensors(seed: int = TINYLLAMA_SEED) -> dict[str, np.ndarray]:
    """LlamaForCausalLM's state dict (transformers' names), drawn in this order: matrices
    normal(0, TINYLLAMA_STD), RMSNorm weights one. The output head is tied to the
    embedding, so it is not stored."""
    c = TINYLLAMA_CONFIG
    hidden, inner, head = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q_rows, kv_rows = c["num_attention_heads"] * head, c["num_key_value_heads"] * head
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}

    def normal(name: str, shape: tuple[int, int]) -> None:
        tensors[name] = (rng.standard_normal(shape) * TINYLLAMA_STD).astype("<f4")

    def ones(name: str) -> None:
        tensors[name] = np.ones(hidden, dtype="<f4")

    normal("model.embed_tokens.weight", (c["vocab_size"], hidden))
    for i in range(c["num_hidden_layers"]):
        layer = f"model.layers.{i}."
        normal(layer + "self_attn.q_proj.weight", (q_rows, hidden))
        normal(layer + "self_attn.k_proj.weight", (kv_rows, hidden))
        normal(layer + "self_attn.v_proj.weight", (kv_rows, hidden))
        normal(layer + "self_attn.o_proj.weight", (hidden, q_rows))
        normal(layer + "mlp.gate_proj.weight", (inner, hidden))
        normal(layer + "mlp.up_proj.weight", (inner, hidden))
        normal(layer + "mlp.down_proj.weight", (hidden, inner))
        ones(layer + "input_layernorm.weight")
        ones(layer + "post_attention_layernorm.weight")
    ones("model.norm.weight")
    return tensors


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as one printable character (what the
    `tokenizers` ByteLevel pre-tokenizer and decoder use)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def tinyllama_tokenizer_json() -> str:
    """A byte-level tokenizer: byte b is token b (a BPE model with no merges over the
    ByteLevel alphabet), BOS added in front of every text, EOS and BOS special."""
    vocab = {char: b for b, char in byte_to_unicode().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(BOS, special=True), AddedToken(EOS, special=True)])
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, BOS_ID), (EOS, EOS_ID)],
    )
    if tokenizer.token_to_id(BOS) != BOS_ID or tokenizer.token_to_id(EOS) != EOS_ID:
        raise AssertionError("the special tokens did not get ids 256 and 257")
    return str(tokenizer.to_str(pretty=True)) + "\n"


def _json(value: dict[str, Any]) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True) + "\n").encode()


def tinyllama_files() -> dict[str, bytes]:
    """The Hugging Face folder's files, by name."""
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "model_max_length": TINYLLAMA_CONFIG["max_position_embeddings"],
        # Byte-level text decodes to exactly its bytes: no space clean-up after decoding.
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    generation_config = {
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": EOS_ID,
        "do_sample": False,
    }
    return {
        "config.json": _json(TINYLLAMA_CONFIG),
        "generation_config.json": _json(generation_config),
        "model.safetensors": save(tinyllama_tensors(), metadata={"format": "pt"}),
        "tokenizer.json": tinyllama_tokenizer_json().encode(),
        "tokenizer_config.json": _json(tokenizer_config),
    }


def main() -> None:
    (HERE / "mlp" / "1" / "weights.f32").write_bytes(mlp_weights())
    (HERE / "tinylm" / "1" / "weights.i32").write_bytes(tinylm_weights())
    TINYLLAMA_DIR.mkdir(parents=True, exist_ok=True)
    for name, data in tinyllama_files().items():
        (TINYLLAMA_DIR / name).write_bytes(data)


if __name__ == "__main__":
    main()
