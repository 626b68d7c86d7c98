"""`make bench-shaping`: batch shaping by prompt length (issue 29, item 5), off and on side
by side in one run.

One node in local mode (`modelswap up`: agent, real Triton, gateway, sim GPU) serves the
`tinyllama` example twice: `tinyllama-off` as it ships (`spec.gateway.batchShaping` off)
and `tinyllama-on`, whose file is then edited live to turn shaping on (`--wait-ms`,
`--edges`). The model batches greedy session-less requests itself (config.pbtxt:
`max_batch_rows` 8, `batch_delay_ms` 10), padding each batch to its longest prompt; each
request's last response says how many pad tokens its prompt got (`padded_tokens`) beside
its `prompt_tokens`.

The workload: bursts of `--burst` concurrent v2 `generate_stream` requests through the
gateway, half short prompts and half long ones, interleaved (short, long, short, ...), each
asking `--max-tokens` greedy tokens. Every repetition sends one burst to each model, the
order alternating; one untimed warm-up burst each first. Per model: padded tokens per
useful (prompt) token over all bursts, the generated tokens per second of each burst
(median), and the longest wait the gateway added (`X-Modelswap-Shaping-Wait-Seconds`).
Every answer is checked against plain transformers' `generate` in this process.

SIGTERM and SIGINT end the run cleanly (the node stopped, the scratch folder removed).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx
import yaml

from bench import local_node, results_schema, scratch

ROOT = Path(__file__).resolve().parents[1]
HF_DIR = ROOT / "examples" / "models" / "tinyllama" / "1" / "hf"
SHAPING_WAIT_HEADER = "X-Modelswap-Shaping-Wait-Seconds"
#: the two deployments
OFF, ON = "tinyllama-off", "tinyllama-on"


def prompts(count: int) -> list[str]:
    """`count` prompts, short and long interleaved (what a busy endpoint sees): short ones
    of 20 to 60 bytes, long ones of 600 to 1,000 (this model's tokenizer is byte-level, so
    tokens are about bytes)."""
    out = []
    for i in range(count):
        if i % 2 == 0:
            out.append(f"question {i}: " + "why " * (2 + (i * 3) % 10))
        else:
            out.append(f"document {i}: " + "modelswap pages idle models out. " * (18 + i % 12))
    return out


@dataclass
class Reply:
    tokens: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    padded_tokens: int = 0
    shaping_wait_seconds: float | None = None


@dataclass
class Burst:
    """One burst's replies and wall time."""

    replies: list[Reply]
    seconds: float

    @property
    def padded_tokens(self) -> int:
        return sum(r.padded_tokens for r in self.replies)

    @property
    def useful_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.replies)

    @property
    def generated_tokens(self) -> int:
        return sum(len(r.tokens) for r in self.replies)


Post = Callable[[str, dict[str, Any]], tuple[int, dict[str, str], str]]


def generate(post: Post, model: str, text: str, max_tokens: int) -> Reply:
    """One v2 generate_stream call through `post` (path, JSON body) → (status, headers,
    body), read into a Reply; AssertionError for anything but a whole answer."""
    body = {"text_input": text, "parameters": {"max_tokens": max_tokens}}
    status, headers, raw = post(f"/v2/models/{model}/generate_stream", body)
    assert status == 200, raw
    reply = Reply()
    wait = {k.lower(): v for k, v in headers.items()}.get(SHAPING_WAIT_HEADER.lower())
    reply.shaping_wait_seconds = None if wait is None else float(wait)
    for line in raw.splitlines():
        if not line.startswith("data: "):
            continue
        event = json.loads(line[len("data: ") :])
        assert "error" not in event, event
        ids = event["token_ids"]  # Triton writes a one-element tensor as a number
        reply.tokens += ids if isinstance(ids, list) else [ids]
        reply.prompt_tokens = int(event.get("prompt_tokens", reply.prompt_tokens))
        reply.padded_tokens = int(event.get("padded_tokens", reply.padded_tokens))
    return reply


def burst(post: Post, model: str, texts: Sequence[str], max_tokens: int) -> Burst:
    """`texts` sent at once, one thread each, started in order."""
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(texts)) as pool:
        futures = [pool.submit(generate, post, model, t, max_tokens) for t in texts]
        replies = [f.result() for f in futures]
    return Burst(replies, time.perf_counter() - started)


class Reference:
    """Plain transformers' greedy `generate` on the example's folder (no cache tricks)."""

    def __init__(self) -> None:
        # torch and transformers only when the bench runs (bench.render imports nothing heavy)
        import torch  # noqa: PLC0415
        from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(HF_DIR)
        self.model: Any = cast(Any, AutoModelForCausalLM.from_pretrained(HF_DIR))
        self.model.eval()
        self.answers: dict[tuple[str, int], list[int]] = {}

    def tokens(self, text: str, max_tokens: int) -> list[int]:
        key = (text, max_tokens)
        if key not in self.answers:
            ids = self.torch.tensor([self.tokenizer(text)["input_ids"]])
            with self.torch.inference_mode():
                out = self.model.generate(
                    ids,
                    attention_mask=self.torch.ones_like(ids),
                    max_new_tokens=max_tokens,
                    do_sample=False,
                )
            self.answers[key] = out[0, ids.shape[1] :].tolist()
        return self.answers[key]


def check(reference: Reference, texts: Sequence[str], got: Burst, max_tokens: int) -> None:
    for text, reply in zip(texts, got.replies, strict=True):
        expected = reference.tokens(text, max_tokens)
        if reply.tokens != expected:
            raise AssertionError(f"{text[:30]!r}...: {reply.tokens} != transformers {expected}")


def shaping_yaml(name: str, weights_bytes: str, shaping: dict[str, Any] | None) -> str:
    spec: dict[str, Any] = {
        "model": {"source": {"uri": "/models/tinyllama"}, "weightsBytes": weights_bytes},
        "swapPolicy": {"idleAfter": "never", "minResident": "1s", "onSwapOut": "host"},
    }
    if shaping is not None:
        spec["gateway"] = {"batchShaping": shaping}
    doc = {
        "apiVersion": "modelswap.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }
    return yaml.safe_dump(doc, sort_keys=False)


def example_weights_bytes() -> str:
    doc = yaml.safe_load((ROOT / "examples" / "tinyllama.yaml").read_text())
    return str(doc["spec"]["model"]["weightsBytes"])


def run(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    shaping = {"maxWaitMilliseconds": args.wait_ms, "promptBytesEdges": args.edges}
    texts = prompts(args.burst)
    reference = Reference()
    case = local_node.real_case("tinyllama")
    cases = [dataclasses.replace(case, name=OFF), dataclasses.replace(case, name=ON)]
    with (
        local_node.model_root(0, real=("tinyllama",)) as root,
        local_node.local_node(cases, workdir, 256 << 20, root) as node,
    ):
        gateway: httpx.Client = node.gateway

        def post(path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], str]:
            r = gateway.post(path, json=body)
            return r.status_code, dict(r.headers), r.text

        # the live edit: local mode pushes the changed file; wait until the gateway shapes
        on_doc = local_node.deployment(cases[1])  # the file as written, shaping added
        on_doc["spec"]["gateway"] = {"batchShaping": shaping}
        (workdir / "deployments" / f"{ON}.yaml").write_text(yaml.safe_dump(on_doc))
        local_node.wait_for(
            lambda: generate(post, ON, texts[0], 1).shaping_wait_seconds is not None,
            120,
            "the gateway to shape tinyllama-on's requests",
        )
        for model in (OFF, ON):  # warm-up, untimed; its answers checked too
            check(reference, texts, burst(post, model, texts, args.max_tokens), args.max_tokens)
        bursts: dict[str, list[Burst]] = {OFF: [], ON: []}
        for rep in range(args.repeats):
            for model in (OFF, ON) if rep % 2 == 0 else (ON, OFF):
                got = burst(post, model, texts, args.max_tokens)
                check(reference, texts, got, args.max_tokens)
                bursts[model].append(got)
                print(
                    f"{model}: {got.seconds:.2f}s padded {got.padded_tokens} "
                    f"useful {got.useful_tokens}",
                    flush=True,
                )
    rows = []
    params = {
        "burst": args.burst,
        "max_tokens": args.max_tokens,
        "max_batch_rows": 8,
        "batch_delay_ms": 10,
        "repeats": args.repeats,
    }
    for model, label in ((OFF, "shaping off"), (ON, "shaping on")):
        runs = bursts[model]
        padded = sum(b.padded_tokens for b in runs)
        useful = sum(b.useful_tokens for b in runs)
        waits = [r.shaping_wait_seconds or 0.0 for b in runs for r in b.replies]
        throughputs = [b.generated_tokens / b.seconds for b in runs]
        row_params = dict(params)
        if model == ON:
            row_params.update({"wait_ms": args.wait_ms, "prompt_bytes_edges": args.edges})
        row = results_schema.result(
            label,
            row_params,
            [b.seconds for b in runs],
            padded_per_useful_token=padded / useful,
            padded_tokens=float(padded),
            useful_tokens=float(useful),
            throughput_tokens_per_second=statistics.median(throughputs),
            max_shaping_wait_seconds=max(waits),
        )
        row["metrics"].update(results_schema.spread([b.seconds for b in runs]))
        rows.append(row)
    off, on = rows
    results_schema.target(
        on,
        "padded_per_useful_token",
        "<=",
        off["metrics"]["padded_per_useful_token"],
        "fewer padded tokens per useful token with shaping on than off",
    )
    results_schema.target(
        on,
        "throughput_tokens_per_second",
        ">=",
        off["metrics"]["throughput_tokens_per_second"],
        "throughput no worse than off",
        why="the bursts' times spread (p25/p75) under a shared machine's load",
    )
    results_schema.target(
        on,
        "max_shaping_wait_seconds",
        "<=",
        args.wait_ms / 1000 + 0.05,
        "the wait the gateway added within the window (+50 ms for the event loop)",
    )
    return rows


NOTES = [
    "Two deployments of tinyllama on one node (sim GPU, real Triton, the gateway), one "
    "with spec.gateway.batchShaping edited on live; bursts sent to each in turn, the order "
    "alternating per repetition; every answer equal to plain transformers' generate.",
    "Padding counts the prompt pad tokens of each batch (the longest prompt's length less "
    "each row's), as the model reports them (padded_tokens); useful tokens are the prompts' "
    "own. Throughput is generated tokens per second of each burst (median).",
]


def reading(args: argparse.Namespace, results: list[dict[str, Any]]) -> str:
    """What the figures say, from the figures."""
    off, on = (r["metrics"] for r in results)
    ratio = on["throughput_tokens_per_second"] / off["throughput_tokens_per_second"]
    return (
        f"Reading: with {args.burst} requests a burst (half of 20-60 bytes, half of "
        f"600-1,000) and batches of up to 8 rows, shaping off padded "
        f"{off['padded_per_useful_token']:.2f} tokens per useful prompt token (short "
        f"prompts batched with long ones) and shaping on ({args.wait_ms} ms, edges "
        f"{args.edges}) {on['padded_per_useful_token']:.2f}; throughput was "
        f"{on['throughput_tokens_per_second']:.0f} against "
        f"{off['throughput_tokens_per_second']:.0f} generated tokens/s ({ratio:.2f}x), "
        f"and the longest wait the gateway added {on['max_shaping_wait_seconds'] * 1000:.0f} "
        f"ms. On this CPU-only sim node the padding is real compute, so less of it is "
        "more throughput; a GPU pads in parallel and may gain less. The bursts are "
        "synthetic (two clearly separated lengths, all at once): a mixed trickle gains less."
    )


def write(args: argparse.Namespace, results: list[dict[str, Any]], load: list[float]) -> Path:
    options = "".join(f" {a}" for a in args.argv)
    return results_schema.write(
        "shaping",
        f"python -m bench.shaping{options}"
        if options
        else "make bench-shaping (python -m bench.shaping)",
        results,
        [*NOTES, reading(args, results)],
        backend="sim",
        scaled=False,
        load_average_start=load,
        out=Path(args.out) if args.out else None,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--burst", type=int, default=16, help="concurrent requests per burst")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--wait-ms", type=int, default=50, help="batchShaping.maxWaitMilliseconds")
    p.add_argument("--edges", default="256", help="batchShaping.promptBytesEdges, comma-separated")
    p.add_argument("--out", default="", help="write the result here instead of bench/results")
    p.add_argument("--no-results", action="store_true", help="print only; write no result file")
    args = p.parse_args(argv)
    given = list(sys.argv[1:] if argv is None else argv)
    args.argv = [a for a in given if a != "--no-results" and not a.startswith("--out")]
    try:
        args.edges = [int(x) for x in args.edges.split(",")]
    except ValueError:
        p.error(f"--edges: byte counts, comma-separated, not {args.edges!r}")
    if args.burst < 2 or args.repeats < 1 or not 1 <= args.wait_ms <= 1000:
        p.error("need --burst >= 2, --repeats >= 1 and --wait-ms within 1..1000")
    scratch.unwind_on_signals()
    load = results_schema.load_average()
    with scratch.directory("modelswap-bench-shaping-", "/dev/shm") as tmp:
        print(f"workdir {tmp}", flush=True)
        results = run(args, Path(tmp))
    for row in results:
        print(row["name"], json.dumps(row["metrics"]))
    if args.no_results:
        return 0
    path = write(args, results, load)
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
