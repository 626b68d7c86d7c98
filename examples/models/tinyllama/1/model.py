"""A Llama-architecture causal language model in a Triton python backend, weights in
modelswap memory, streaming text through Triton's generate extension.

This is the file to copy for a Hugging Face text-generation model. Without modelswap it
would be the same file minus the lines marked `# modelswap` (6 of them: two imports,
`attach_model`, `mstorch.from_pretrained` in place of `AutoModelForCausalLM.
from_pretrained`, `with self.att.in_use():` around each request's generation, `close()`),
and the conversations' KV cache marked `# modelswap (KV cache)` (below):

- `initialize` attaches to the node's agent, which hands the model a weights region of
  `weightsBytes`. `mstorch.from_pretrained` builds the model with its parameters on the
  meta device and either binds them to the bytes the agent restored from its host copy
  (after a crash or a Triton restart: no weight file is read) or loads the safetensors
  straight into the region and commits them (saved to the host store, once).
- The model is decoupled: `execute` starts one thread per request and returns; the
  thread holds `in_use()` until its final response is sent, so a swapped-out model is
  swapped back in first and no swap-out happens mid-stream. Parameters keep their
  addresses across swaps.

Each request: `text_input` (UTF-8) is tokenized as transformers does (BOS first), then one
token at a time with a KV cache (below); each response carries the text that became
complete (a byte-level token can be part of a UTF-8 character) and the `token_ids` it
covers; the last also
`finish_reason`: "stop" (EOS, which is in its token_ids but has no text, or a stop
string, which is cut from the text) or "length" (max_tokens, or the context's end). A
request its client cancels (the gateway cancels it when the client hangs up) stops at the
next token and its stream ends without another response.

The KV cache (issue 29): a request naming a session (the parameter `session_id`, which the
gateway sends scoped `namespace/name/id`, from the `X-Modelswap-Session` header or OpenAI's
`user`) keeps its conversation's K/V in modelswap memory between turns
(`modelswap_client.kv_sessions` over `modelswap_client.kv_cache`): the first
`kvCache.offloadAfterTokens` tokens of a sequence in the KV region (`spec.model.kvCacheBytes`,
HBM), later ones in the host tier (`kvCache.hostBytes`). A follow-up turn whose prompt
starts with the conversation so far (the last prompt and its answer) computes only the new
tokens; K/V lost to a `kv: discard` swap-out (or taken by another session) is computed
again from the session's token ids first, never read stale. At most `max_sessions` (a
model parameter) sessions are kept, least recently used evicted first; session turns run
one at a time. The store reports its blocks per tier and its hits, misses, evictions and
tokens reused and recomputed with every heartbeat (the agent's `modelswap_kv_*` metrics).
A request without a session, or a model deployed without `kvCacheBytes`, uses
transformers' DynamicCache in torch's own memory (not paged), as before.

Batching (issue 29, item 5): with the model parameter `max_batch_rows` above 1, greedy
requests without logprobs that keep no session (`Batcher`) wait up to `batch_delay_ms` for
others and run as one batch of at most `max_batch_rows` rows, taken in arrival order: the
prompts left-padded to the longest with an attention mask (and position ids counted from
each prompt's first token), so each row's tokens equal its own unbatched `generate`; then
one token per row per pass until every row has ended (its EOS, stop string, max_tokens or
cancellation). A batched request's last response carries `padded_tokens`: the pad tokens
its prompt got (the longest prompt's length less its own), against its `prompt_tokens`
(the useful ones): the gateway's batch shaping (`spec.gateway.batchShaping`) makes it
smaller by sending similar lengths together, each bucket it releases as one
`batch_group`, which a batch never mixes with another. Other requests run on their own, as before.

Request parameters (what the gateway's OpenAI routes send; all optional):
    max_tokens         default: the `default_max_tokens` model parameter, less where the
                       context (max_position_embeddings) ends first; asking for more than
                       the context leaves is an error
    temperature        absent or 0: greedy, the tokens `generate(do_sample=False)` gives;
                       above 0: sampling, as `generate(do_sample=True, temperature=...,
                       top_k=..., top_p=...)` does it (the same logits processors, in order)
    top_k, top_p       with temperature > 0: 0 / 1.0 (absent) filter nothing
    seed               with temperature > 0: the same seed gives the same tokens (a
                       torch.Generator per request; absent: a random seed)
    stop               a string, or a JSON list of strings: the text ends before the first
    logprobs           0 to 20: each response also carries its tokens' text (`tokens`), their
                       log-probabilities (`logprobs`: log-softmax of the model's logits, before
                       any temperature) and the `logprobs` most likely tokens at each step with
                       theirs (`top_tokens`, `top_logprobs`, flattened, most likely first)
    presence_penalty, frequency_penalty    not implemented: refused unless 0
    session_id         the conversation whose KV cache to use and keep (above)
    batch_group        the gateway's batch shaping: requests of one group are batched
                       together and apart from others (`Batcher`)
A parameter outside these ranges is refused with an error response naming it. Every
response also carries `prompt_tokens` (the prompt's token count, BOS included), so the
gateway can report `usage`. The config's `sampling_parameters` lists the sampling fields
taken, for the gateway to refuse others before the request reaches the model.

A token's text (`tokens`, `top_tokens`) is its bytes as UTF-8, or when they are not whole
UTF-8 (a byte-level token inside a character) OpenAI's spelling `bytes:\\xe2\\x82`; a
special token is its name (`</s>`).
"""

import contextlib
import json
import math
import os
import threading
import time
from pathlib import Path

# Every file is local: transformers must never try the Hugging Face Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from modelswap_client import kv_cache, kv_sessions  # modelswap (KV cache)
from modelswap_client import torch as mstorch  # modelswap
from modelswap_client.triton import KV_TAG, attach_model  # modelswap

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
#: How long `finalize` waits for each running request to finish.
FINALIZE_WAIT_SECONDS = 30.0
#: Most alternatives per token a request may ask for (OpenAI's own bound).
MAX_TOP_LOGPROBS = 20


def parameter(config, key, default):
    return config.get("parameters", {}).get(key, {}).get("string_value", default)


def model_folder(args, config):
    """The Hugging Face folder: parameter `model_dir`, absolute or relative to this
    model's folder."""
    path = Path(parameter(config, "model_dir", "1/hf"))
    return path if path.is_absolute() else Path(args["model_repository"]) / path


class Sampling:
    """A request's sampling parameters, checked; `ValueError` names the one that is wrong."""

    def __init__(self, parameters, *, default_max_tokens, context_left):
        def number(name, default, low, high=math.inf, *, integer=False):
            value = parameters.get(name, default)
            if value is None:
                return None
            kinds = (int,) if integer else (int, float)
            if isinstance(value, bool) or not isinstance(value, kinds):
                raise ValueError(f"{name}: must be {'an integer' if integer else 'a number'}")
            if not (low <= value <= high):
                limits = f"at least {low}" if high == math.inf else f"between {low} and {high}"
                raise ValueError(f"{name}: must be {limits}, not {value}")
            return value

        for name in ("presence_penalty", "frequency_penalty"):
            if number(name, 0, -math.inf) != 0:
                raise ValueError(f"{name}: not implemented by this model (leave it 0)")
        self.temperature = float(number("temperature", 0, 0))
        self.top_k = int(number("top_k", 0, 0, integer=True))
        self.top_p = float(number("top_p", 1.0, 0.0, 1.0))
        if self.top_p == 0:
            raise ValueError("top_p: must be above 0")
        self.seed = number("seed", None, -(2**63), 2**64 - 1, integer=True)
        self.logprobs = number("logprobs", None, 0, MAX_TOP_LOGPROBS, integer=True)
        self.stop = stop_strings(parameters.get("stop"))
        if context_left < 1:
            raise ValueError("text_input: the prompt fills the model's whole context")
        asked = number("max_tokens", None, 1, integer=True)
        if asked is not None and asked > context_left:
            raise ValueError(
                f"max_tokens: {asked} is more than the {context_left} tokens the context "
                "leaves after the prompt"
            )
        self.max_tokens = asked if asked is not None else min(default_max_tokens, context_left)

    def generator(self, device):
        """The request's random source on `device` (None when greedy)."""
        if self.temperature == 0:
            return None
        generator = torch.Generator(device=device)
        if self.seed is None:
            generator.seed()
        else:
            generator.manual_seed(self.seed % 2**64)
        return generator

    def pick(self, logits, generator):
        """The next token from the last position's logits [1, vocab], as transformers'
        generate picks it: argmax, or its warpers (temperature, top-k, top-p) then a
        multinomial draw."""
        if generator is None:
            return int(torch.argmax(logits, dim=-1))
        scores = logits / self.temperature if self.temperature != 1.0 else logits
        if self.top_k:
            kth = torch.topk(scores, min(self.top_k, scores.size(-1)))[0][..., -1, None]
            scores = scores.masked_fill(scores < kth, -math.inf)
        if self.top_p < 1.0:
            sorted_scores, order = torch.sort(scores, descending=False)
            cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
            drop = cumulative <= (1 - self.top_p)
            drop[..., -1:] = False  # keep at least the most likely token
            scores = scores.masked_fill(drop.scatter(1, order, drop), -math.inf)
        probs = torch.nn.functional.softmax(scores, dim=-1)
        return int(torch.multinomial(probs, num_samples=1, generator=generator))


def stop_strings(value):
    """`stop` as a tuple of strings: one string, or a JSON list of them (the gateway
    sends a list that way)."""
    if value is None:
        return ()
    if isinstance(value, str) and value.startswith("["):
        with contextlib.suppress(ValueError):
            value = json.loads(value)
    strings = (value,) if isinstance(value, str) else value
    if not isinstance(strings, (list, tuple)) or not all(isinstance(s, str) and s for s in strings):
        raise ValueError("stop: must be a non-empty string or a list of them")
    return tuple(strings)


class TextStream:
    """Token ids in, text out as soon as it is final: a byte-level token may end inside a
    UTF-8 character (held until the character is whole), and text that could be the start
    of a stop string is held until it is known not to be one. The pieces joined are
    `tokenizer.decode(all ids, skip_special_tokens=True)`, cut before the first stop
    string."""

    def __init__(self, tokenizer, stop):
        self.tokenizer, self.stop = tokenizer, stop
        self.ids = []
        self.prefix_offset = self.read_offset = 0  # ids decoded before / up to held text
        self.held = ""  # final text not yet sent (a possible stop string's start)
        self.stopped = False

    def _decode(self, ids):
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, token):
        """Take one token; the text now safe to send ("" when none)."""
        self.ids.append(token)
        before = self._decode(self.ids[self.prefix_offset : self.read_offset])
        text = self._decode(self.ids[self.prefix_offset :])
        if len(text) <= len(before) or text.endswith("\ufffd"):
            return ""  # nothing new, or a character still incomplete
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return self._release(text[len(before) :])

    def finish(self):
        """The rest of the text once generation ends (an incomplete character included,
        decoded as U+FFFD, as decode() does)."""
        if self.stopped:
            return ""
        before = self._decode(self.ids[self.prefix_offset : self.read_offset])
        rest = self._release(self._decode(self.ids[self.prefix_offset :])[len(before) :])
        if self.stopped:
            return rest
        rest, self.held = rest + self.held, ""
        return rest

    def _release(self, new):
        text = self.held + new
        cuts = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if cuts:
            self.stopped, self.held = True, ""
            return text[: min(cuts)]
        keep = max(
            (k for s in self.stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0
        )
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]


def byte_level_alphabet():
    """Byte-level BPE's printable stand-in for each byte (GPT-2's `bytes_to_unicode`)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


def token_texts(tokenizer):
    """Every token id's text as the OpenAI routes show it (see the module's docstring)."""
    byte_of = byte_level_alphabet()
    special = set(tokenizer.all_special_ids)
    texts = []
    for token_id, piece in enumerate(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))):
        if token_id in special or not all(c in byte_of for c in piece):
            texts.append(piece)
            continue
        raw = bytes(byte_of[c] for c in piece)
        try:
            texts.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            texts.append("bytes:" + "".join(f"\\x{b:02x}" for b in raw))
    return texts


def text_of(request):
    raw = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)
    if raw.size != 1:
        raise ValueError(f"text_input: one text per request, not {raw.size}")
    item = raw[0]
    if isinstance(item, str):
        return item
    try:
        return bytes(item).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"text_input is not UTF-8: {e}") from None


def strings(values):
    return np.array([v.encode() for v in values], dtype=np.object_)


def response(text, token_ids, prompt_tokens, finish_reason=None, scores=None, *, padded=None):
    """One response: `scores` (when logprobs were asked) holds, per token of
    `token_ids`, (its text, its log-probability, [(alternative's text, its log-probability)]);
    `padded`: the pad tokens a batched request's prompt got (its last response)."""
    tensors = [
        pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_)),
        pb_utils.Tensor("token_ids", np.array(token_ids, dtype=np.int32)),
        pb_utils.Tensor("prompt_tokens", np.array([prompt_tokens], dtype=np.int32)),
    ]
    if scores is not None:
        top = [pair for _, _, alternatives in scores for pair in alternatives]
        tensors += [
            pb_utils.Tensor("tokens", strings([t for t, _, _ in scores])),
            pb_utils.Tensor("logprobs", np.array([lp for _, lp, _ in scores], dtype=np.float32)),
            pb_utils.Tensor("top_tokens", strings([t for t, _ in top])),
            pb_utils.Tensor("top_logprobs", np.array([lp for _, lp in top], dtype=np.float32)),
        ]
    if finish_reason is not None:
        tensors.append(
            pb_utils.Tensor("finish_reason", np.array([finish_reason.encode()], dtype=np.object_))
        )
    if padded is not None:
        tensors.append(pb_utils.Tensor("padded_tokens", np.array([padded], dtype=np.int32)))
    return pb_utils.InferenceResponse(tensors)


class Row:
    """One batched request: its stream of responses, sent as its tokens come."""

    def __init__(self, model, request, sender, prompt_ids, sampling, *, group=None):
        self.model, self.request, self.sender = model, request, sender
        self.prompt_ids, self.sampling = prompt_ids, sampling
        self.group = group  # the gateway's batch_group: batched only with its own group
        self.stream = TextStream(model.tokenizer, sampling.stop)
        self.pending = []
        self.padded = 0
        self.done = False
        self.finished = threading.Event()  # its final response is sent

    def take(self, token, count):
        """The row's `count`th token: sent when it completes text, or ends the row."""
        if self.request.is_cancelled():  # the client hung up: stop generating for no one
            pb_utils.Logger.log_info(
                f"tinyllama: request cancelled by its client after {count - 1} tokens"
            )
            self.end(None)
            return
        self.pending.append(token)
        text = self.stream.add(token)
        if token in self.model.eos or self.stream.stopped:
            self.end(self._final(text, "stop"))
        elif count >= self.sampling.max_tokens:
            self.end(self._final(text, "length"))
        elif text:
            self.sender.send(response(text, self.pending, len(self.prompt_ids)))
            self.pending = []

    def _final(self, text, reason):
        rest = text + self.stream.finish()
        return response(rest, self.pending, len(self.prompt_ids), reason, padded=self.padded)

    def end(self, final):
        self.done = True
        if final is None:
            self.sender.send(flags=FINAL)
        else:
            self.sender.send(final, flags=FINAL)


class Batcher:
    """Requests queued for batches of at most `max_rows`, run one batch at a time by one
    thread: a batch starts `delay_seconds` after its first request arrived, or at once when
    `max_rows` wait. A batch takes the oldest request and the requests of its group after
    it, in arrival order (a group: the gateway's `batch_group`, the requests its batch
    shaping released together; requests without one form one group), so a group of
    similar prompt lengths is never mixed with another. Each request's thread waits until
    its row has ended."""

    def __init__(self, run_batch, *, max_rows, delay_seconds):
        self.run_batch, self.max_rows, self.delay_seconds = run_batch, max_rows, delay_seconds
        self.cond = threading.Condition()
        self.queued = []
        self.arrived = 0  # requests queued so far (tests order their arrivals by it)
        self.closed = False
        self.worker = None

    def run(self, row):
        with self.cond:
            if self.closed:
                raise RuntimeError("the model is shutting down")
            if self.worker is None:
                self.worker = threading.Thread(target=self._work, daemon=True)
                self.worker.start()
            self.queued.append(row)
            self.arrived += 1
            self.cond.notify_all()
        row.finished.wait()

    def _work(self):
        while True:
            with self.cond:
                while not self.queued and not self.closed:
                    self.cond.wait()
                if not self.queued:
                    return
                group = self.queued[0].group
                deadline = time.monotonic() + self.delay_seconds
                while self._count(group) < self.max_rows and not self.closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self.cond.wait(left)
                rows = [row for row in self.queued if row.group == group][: self.max_rows]
                taken = {id(row) for row in rows}
                self.queued = [row for row in self.queued if id(row) not in taken]
            try:
                self.run_batch(rows)
            except Exception as e:  # each stream must end with a final response
                error = pb_utils.InferenceResponse(error=pb_utils.TritonError(f"tinyllama: {e}"))
                for row in rows:
                    if not row.done:
                        row.end(error)
            finally:
                for row in rows:
                    row.finished.set()

    def _count(self, group):
        return sum(1 for row in self.queued if row.group == group)

    def close(self):
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        if self.worker is not None:
            self.worker.join(timeout=FINALIZE_WAIT_SECONDS)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        torch.set_num_threads(int(parameter(config, "cpu_threads", "1")))
        folder = model_folder(args, config)
        self.default_max_tokens = int(parameter(config, "default_max_tokens", "128"))
        self.att = attach_model(args)  # modelswap
        self.model = mstorch.from_pretrained(self.att, AutoModelForCausalLM, folder)  # modelswap
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.token_texts = token_texts(self.tokenizer)
        self.context = int(self.model.config.max_position_embeddings)
        self.eos = self.model.config.eos_token_id
        self.eos = set(self.eos if isinstance(self.eos, list) else [self.eos])
        self.threads = set()
        self.threads_lock = threading.Lock()
        self.sessions = None  # conversations' KV caches, with spec.model.kvCacheBytes
        if KV_TAG in self.att.regions:  # modelswap (KV cache)
            kv = kv_cache.for_attachment(self.att, self.model.config)
            self.sessions = kv_sessions.KvSessionStore(
                kv,
                namespace="",  # the gateway scopes session ids: namespace/name/id
                model=args["model_name"],
                max_sessions=int(parameter(config, "max_sessions", "16")),
                hold=self.att.in_use,
            )
            self.att.report_kv(self.sessions.report)
        self.batcher = None  # greedy session-less requests batched, with max_batch_rows > 1
        max_rows = int(parameter(config, "max_batch_rows", "1"))
        if max_rows > 1:
            delay_seconds = float(parameter(config, "batch_delay_ms", "10")) / 1000
            self.batcher = Batcher(self.run_batch, max_rows=max_rows, delay_seconds=delay_seconds)
        self.pad = self.tokenizer.pad_token_id
        self.pad = min(self.eos) if self.pad is None else self.pad

    def run_batch(self, rows):
        """Generate for `rows` as one batch: prompts left-padded to the longest, masked."""
        longest = max(len(row.prompt_ids) for row in rows)
        for row in rows:
            row.padded = longest - len(row.prompt_ids)
        with self.att.in_use(), torch.inference_mode():  # modelswap
            device = self.model.device
            ids = torch.tensor(
                [[self.pad] * row.padded + row.prompt_ids for row in rows], device=device
            )
            mask = torch.tensor(
                [[0] * row.padded + [1] * len(row.prompt_ids) for row in rows], device=device
            )
            # each row's positions from its own first token, as it would have alone
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            cache = DynamicCache(config=self.model.config)
            for count in range(1, max(row.sampling.max_tokens for row in rows) + 1):
                out = self.model(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=positions,
                    cache=cache,
                    use_cache=True,
                    logits_to_keep=1,
                )
                tokens = torch.argmax(out.logits[:, -1, :].float(), dim=-1)
                for row, token in zip(rows, tokens.tolist(), strict=True):
                    if not row.done:
                        row.take(token, count)
                if all(row.done for row in rows):
                    return
                ids = tokens[:, None]
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
                positions = positions[:, -1:] + 1

    def tokens(self, ids, cache, sampling):
        """Generated (token id, its scores or None), one at a time: `ids` (what `cache`
        does not hold yet) in one forward pass, then one token per pass over the cache."""
        device = self.model.device  # the region's: the CPU on the sim backend, else the GPU
        generator = sampling.generator(device)
        ids = torch.tensor([ids], device=device)
        for _ in range(sampling.max_tokens):
            out = self.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
            logits = out.logits[:, -1, :].float()
            token = sampling.pick(logits, generator)
            yield token, self.scores(logits, token, sampling.logprobs)
            ids = torch.tensor([[token]], device=device)

    def scores(self, logits, token, alternatives):
        """(token's text, its log-probability, the `alternatives` most likely tokens'
        (text, log-probability)) from the logits [1, vocab]; None when not asked."""
        if alternatives is None:
            return None
        logprobs = torch.log_softmax(logits[0], dim=-1)
        top = torch.topk(logprobs, alternatives) if alternatives else None
        pairs = [] if top is None else zip(top.indices.tolist(), top.values.tolist(), strict=True)
        return (
            self.token_texts[token],
            float(logprobs[token]),
            [(self.token_texts[i], float(lp)) for i, lp in pairs],
        )

    def generate(self, request, sender):
        """Stream one request's answer; every way out ends with a final response."""
        try:
            prompt_ids = self.tokenizer(text_of(request))["input_ids"]
            parameters = json.loads(request.parameters() or "{}")
            sampling = Sampling(
                parameters,
                default_max_tokens=self.default_max_tokens,
                context_left=self.context - len(prompt_ids),
            )
        except ValueError as e:
            error = pb_utils.TritonError(str(e), pb_utils.TritonError.INVALID_ARG)
            sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
            return
        session = parameters.get("session_id")
        alone = session is not None and self.sessions is not None
        greedy = sampling.temperature == 0 and sampling.logprobs is None
        try:
            if self.batcher is not None and greedy and not alone:
                group = parameters.get("batch_group")
                group = None if group is None else str(group)
                self.batcher.run(Row(self, request, sender, prompt_ids, sampling, group=group))
            elif alone:
                # the store holds in_use() for the turn (after its lock: never the other
                # way round, or a swap-out draining could wait on a thread that waits on
                # the lock)
                turn_of = self.sessions.turn  # modelswap (KV cache)
                with turn_of(str(session), prompt_ids, self.model) as turn:
                    held = turn.reused_tokens + turn.recomputed_tokens
                    with torch.inference_mode():
                        generated = self.stream(
                            request, sender, prompt_ids, sampling, cache=turn.cache, held=held
                        )
                    turn.keep(prompt_ids + generated)  # the answer is prefix next turn
            else:
                with self.att.in_use(), torch.inference_mode():  # modelswap
                    cache = DynamicCache(config=self.model.config)
                    self.stream(request, sender, prompt_ids, sampling, cache=cache, held=0)
        except Exception as e:  # the stream must end with a final response either way
            error = pb_utils.TritonError(f"tinyllama: {e}")
            sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)

    def stream(self, request, sender, prompt_ids, sampling, *, cache, held):
        """Generate over `cache`, which holds the first `held` tokens of the prompt, and
        send the responses; the tokens generated."""
        stream = TextStream(self.tokenizer, sampling.stop)
        pending, scores, reason, generated = [], [], "length", []
        asked = sampling.logprobs is not None
        prompt_tokens = len(prompt_ids)
        text = ""
        for count, (token, score) in enumerate(
            self.tokens(prompt_ids[held:], cache, sampling), start=1
        ):
            if request.is_cancelled():  # the client hung up: stop generating for no one
                pb_utils.Logger.log_info(
                    f"tinyllama: request cancelled by its client after {count - 1} tokens"
                )
                sender.send(flags=FINAL)
                return generated
            generated.append(token)
            pending.append(token)
            scores.append(score)
            text = stream.add(token)
            if token in self.eos or stream.stopped:
                reason = "stop"
                break
            if text and count < sampling.max_tokens:
                sender.send(response(text, pending, prompt_tokens, None, scores if asked else None))
                pending, scores = [], []
        rest = text + stream.finish()
        final = response(rest, pending, prompt_tokens, reason, scores if asked else None)
        sender.send(final, flags=FINAL)
        return generated

    def _run(self, request, sender):
        try:
            self.generate(request, sender)
        finally:
            with self.threads_lock:
                self.threads.discard(threading.current_thread())

    def execute(self, requests):
        for request in requests:
            thread = threading.Thread(
                target=self._run, args=(request, request.get_response_sender()), daemon=True
            )
            with self.threads_lock:
                self.threads.add(thread)
            thread.start()

    def finalize(self):
        if self.batcher is not None:
            self.batcher.close()
        with self.threads_lock:
            threads = list(self.threads)
        for thread in threads:
            thread.join(timeout=FINALIZE_WAIT_SECONDS)
        self.att.close()  # modelswap
