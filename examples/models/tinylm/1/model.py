"""A tiny deterministic autoregressive model with a tiered KV cache, decoupled.

Weights (integer matrices E, Wq, Wk, Wv, Wo) live in agent memory through the client
library, tiled across a `modelswap.weights_bytes` region. The KV cache is the client's
tiered KV pool (`Attachment.kv_pool`): its HBM tier is a `modelswap.kv_cache_bytes` KV
region the agent maps; tokens past the model's `kvCache.offloadAfterTokens` get blocks of
the host tier (an agent-owned host-store file of `kvCache.hostBytes`). After a swap-out
with `onSwapOut: drop` the weights are loaded from the file again on the next request.
One step, for token t at position p (all int64, exact):

    x = E[t] + (p % 7 - 3);  q, k, v = (x @ Wq, x @ Wk, x @ Wv) mod 1009
    append (k, v) to the KV cache
    a_i = (q . k_i) mod 17 + 1 over every cached position i
    h = (sum_i a_i v_i) mod 1009 + x;  next = argmax(h @ Wo)  (first on ties)

Each request runs on its own thread, which holds `in_use()` until the final response has
been sent (not until `execute` returns), so a swap-out waits for a stream to finish; it
checks `request.is_cancelled()` before each token and stops when its client went away or
the gateway ended it (a swap-out's drain past its deadline), leaving `in_use()`.
Standard library, numpy and modelswap_client only (the stub's environment).
"""

import ctypes
import json
import os
import threading
import time
import zlib

import numpy as np
import triton_python_backend_utils as pb_utils

from modelswap_client.client import RegionSpec, attach
from modelswap_client.kvpool import Tier

MODULUS = 1009
SCORE_MODULUS = 17
# Text mode (the gateway's OpenAI routes): prompt bytes modulo the vocabulary in, one
# character of this alphabet per token out. Mirrors examples/models/reference.py.
ALPHABET = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789."
DEFAULT_MAX_TOKENS = 16


def _param(config, key, default=None):
    entry = config.get("parameters", {}).get(key)
    if entry is None:
        if default is None:
            raise ValueError(f"model parameter {key} is missing")
        return default
    return entry["string_value"]


def tile_into(view, data):
    n, size = len(data), len(view)
    view[: min(n, size)] = data[: min(n, size)]
    filled = min(n, size)
    while filled < size:
        step = min(filled, size - filled)
        view[filled : filled + step] = view[:step]
        filled += step


def _int_input(request, name, default=None):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    return tensor.as_numpy().reshape(-1).astype(np.int64)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.vocab = int(_param(config, "vocab"))
        self.dim = int(_param(config, "dim"))
        v, d = self.vocab, self.dim
        self.shapes = [(v, d), (d, d), (d, d), (d, d), (d, v)]  # E, Wq, Wk, Wv, Wo
        self.n_values = sum(a * b for a, b in self.shapes)
        weights_bytes = int(_param(config, "modelswap.weights_bytes"))
        kv_bytes = int(_param(config, "modelswap.kv_cache_bytes"))
        minimum = int(_param(config, "min_weights_bytes", "0"))
        if weights_bytes < minimum:
            raise ValueError(f"weightsBytes {weights_bytes} is below this model's {minimum}")
        if kv_bytes <= 0:
            raise ValueError("tinylm needs a KV cache: set spec.model.kvCacheBytes")
        self.tokens_per_block = int(_param(config, "tokens_per_block"))
        self.block_bytes = self.tokens_per_block * 2 * d * 4  # k and v, int32
        self.att = attach(
            args["model_name"],
            [RegionSpec("weights", weights_bytes), RegionSpec("kv", kv_bytes, "kv")],
            instance=args["model_instance_name"],
            socket_path=_param(config, "modelswap.agent_socket"),
            mapper=_param(config, "modelswap.mapper", "sim"),
        )
        self.path = os.path.join(os.path.dirname(__file__), _param(config, "weights_file"))
        self.restored = bool(self.att.restored)
        if not self.restored:
            self._load_weights()
        # HBM tier: the KV region; host tier: the agent's file, per the model's kvCache policy
        self.pool = self.att.kv_pool(
            "kv", block_bytes=self.block_bytes, tokens_per_block=self.tokens_per_block
        )
        self.pool_lock = threading.Lock()
        self.load_lock = threading.Lock()
        self.sequences = 0
        self.threads = set()
        self.threads_lock = threading.Lock()

    def _load_weights(self):
        """Tile the weight file across the region and have the agent save it (once)."""
        with open(self.path, "rb") as f:
            data = f.read()
        if len(data) != self.n_values * 4:
            raise ValueError(f"{self.path}: {len(data)} bytes, expected {self.n_values * 4}")
        tile_into(self.att.regions["weights"].view(), data)
        self.att.commit()

    # -- the model ----------------------------------------------------------------------

    def _weights(self):
        flat = self.att.regions["weights"].numpy("<i4")[: self.n_values].astype(np.int64)
        out, offset = [], 0
        for a, b in self.shapes:
            out.append(flat[offset : offset + a * b].reshape(a, b))
            offset += a * b
        return out

    def _slot(self, seq_id, position):
        """(k, v) int32 arrays over the cache slot of `position`, and the block's tier."""
        block = self.pool.blocks(seq_id)[position // self.tokens_per_block]
        offset = (position % self.tokens_per_block) * 2 * self.dim * 4
        raw = (ctypes.c_char * (2 * self.dim * 4)).from_address(block.address + offset)
        kv = np.frombuffer(raw, dtype="<i4").reshape(2, self.dim)
        return kv, block.tier

    def _step(self, weights, seq_id, token, position):
        emb, wq, wk, wv, wo = weights
        x = emb[token] + (position % 7 - 3)
        q, k, v = (x @ wq) % MODULUS, (x @ wk) % MODULUS, (x @ wv) % MODULUS
        with self.pool_lock:
            self.pool.append_tokens(seq_id, 1)
        slot, tier = self._slot(seq_id, position)
        slot[0], slot[1] = k, v
        acc = np.zeros(self.dim, dtype=np.int64)
        for i in range(position + 1):
            kv, _ = self._slot(seq_id, i)
            a = int(q @ kv[0].astype(np.int64)) % SCORE_MODULUS + 1
            acc += a * kv[1].astype(np.int64)
        h = acc % MODULUS + x
        return int(np.argmax(h @ wo)), tier

    def _prompt(self, request):
        """(token ids, max tokens, text mode) from PROMPT/MAX_TOKENS or text_input."""
        text = pb_utils.get_input_tensor_by_name(request, "text_input")
        if text is None:
            prompt = _int_input(request, "PROMPT")
            max_tokens = _int_input(request, "MAX_TOKENS")
            if prompt is None or max_tokens is None:
                raise ValueError("give PROMPT and MAX_TOKENS, or text_input")
            return prompt, int(max_tokens[0]), False
        raw = text.as_numpy().reshape(-1)[0]
        data = raw if isinstance(raw, bytes) else str(raw).encode()
        prompt = np.array([b % self.vocab for b in data] or [0], dtype=np.int64)
        parameters = json.loads(request.parameters() or "{}")
        return prompt, int(parameters.get("max_tokens", DEFAULT_MAX_TOKENS)), True

    def _generate(self, request, sender):
        delay = _int_input(request, "DELAY_MS")
        delay_seconds = float(delay[0]) / 1000.0 if delay is not None else 0.0
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            prompt, max_tokens, text_mode = self._prompt(request)
            if len(prompt) == 0 or max_tokens < 1 or prompt.min() < 0 or prompt.max() >= self.vocab:
                raise ValueError(f"PROMPT needs token ids in [0, {self.vocab}), MAX_TOKENS >= 1")
            with self.att.in_use(), self._sequence() as seq_id:
                with self.load_lock:
                    if not self.att.committed:  # swapped in after a drop: fresh memory
                        self._load_weights()
                        self.restored = False
                weights = self._weights()
                token, tier, position = 0, Tier.HBM, 0
                for position, t in enumerate(prompt.tolist()):
                    token, tier = self._step(weights, seq_id, t, position)
                for index in range(max_tokens):
                    if request.is_cancelled():  # the client hung up: stop generating for no one
                        sender.send(flags=final)
                        return
                    if delay_seconds:
                        time.sleep(delay_seconds)
                    last = index == max_tokens - 1
                    checksum = zlib.crc32(self.att.regions["weights"].view()) if last else -1
                    if text_mode:
                        response = self._text_response(token, len(prompt), last)
                    else:
                        response = self._response(token, index, tier, checksum)
                    sender.send(response, flags=final if last else 0)
                    if not last:
                        position += 1
                        token, tier = self._step(weights, seq_id, token, position)
                del weights
        except Exception as e:  # the stream must end with a final response either way
            error = pb_utils.TritonError(f"tinylm: {e}")
            sender.send(pb_utils.InferenceResponse(error=error), flags=final)

    def _response(self, token, index, tier, checksum):
        def one(name, value, dtype):
            return pb_utils.Tensor(name, np.array([value], dtype=dtype))

        return pb_utils.InferenceResponse(
            [
                one("TOKEN", token, np.int32),
                one("INDEX", index, np.int32),
                one("TIER", 1 if tier is Tier.HOST else 0, np.int32),
                one("CHECKSUM", checksum, np.int64),
                one("RESTORED", self.restored, bool),
            ]
        )

    def _text_response(self, token, prompt_tokens, last):
        """One character, the token it is and the prompt's token count (the gateway's
        `usage`); the last also finish_reason "length" (there is no end-of-text token: the
        text always runs to max_tokens)."""

        def strings(value):
            return np.array([value.encode()], dtype=np.object_)

        tensors = [
            pb_utils.Tensor("text_output", strings(ALPHABET[token])),
            pb_utils.Tensor("token_ids", np.array([token], dtype=np.int32)),
            pb_utils.Tensor("prompt_tokens", np.array([prompt_tokens], dtype=np.int32)),
        ]
        if last:
            tensors.append(pb_utils.Tensor("finish_reason", strings("length")))
        return pb_utils.InferenceResponse(tensors)

    def _sequence(self):
        model = self

        class _Seq:
            def __enter__(self):
                with model.pool_lock:
                    model.sequences += 1
                    self.seq_id = f"seq-{model.sequences}"
                return self.seq_id

            def __exit__(self, *exc):
                with model.pool_lock:
                    model.pool.free(self.seq_id)

        return _Seq()

    def _run(self, request, sender):
        try:
            self._generate(request, sender)
        finally:
            with self.threads_lock:
                self.threads.discard(threading.current_thread())

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            t = threading.Thread(target=self._run, args=(request, sender), daemon=True)
            with self.threads_lock:
                self.threads.add(t)
            t.start()

    def finalize(self):
        with self.threads_lock:
            threads = list(self.threads)
        for t in threads:
            t.join(timeout=30)
        self.pool.close()
        self.att.close()
