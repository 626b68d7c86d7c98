"""The node fuzzed (issue 26, acceptance): the real agent with its gateway and the real
Triton, four models, and at once

- schemathesis against the control API's OpenAPI document (`docs/control-api.openapi.yaml`):
  every operation, with data the document allows and data it does not
  (`GenerationMode.POSITIVE` and `NEGATIVE`), mostly with the right token, path uids
  sometimes those of the fuzzed models. Every answer must be a status the document
  declares for the operation, with a body of its schema, and not a 5xx;
- a seeded generator of hostile gateway requests (`tests/support/hostile_bodies.py`): v2
  infer bodies as JSON and binary tensors, generate bodies, OpenAI completions, chat and
  embeddings bodies, odd encodings and headers, raw HTTP no client library would send,
  at the toy models `batched`, `tokens` and `hashembed` (tests/data/gateway_models). No
  answer may be a 5xx other than the documented 503/429 with `Retry-After`; raw bytes the
  server's HTTP parser refuses, or a body that ends early (the sender half-closes), may
  be answered by closing the connection.

Throughout: every request is answered within ANSWER_SECONDS (no hang); Triton's process is
the same one from start to end, and its log has no `std::bad_alloc` or abort; the agent is
the same process; and the model nobody fuzzes (`other`, examples/models/mlp, 2 MiB) answers
correctly (examples/models/reference.py) every CHECK_EVERY gateway inputs and at the end.

The node's revision is put at the bound (2^53 - 1 for term and counter), so a generated
set can replace the node's set only at that very revision; when one does (200), the test
pushes the real set back at once, within the grace period, so no model is unloaded.

`make reliability` (MODELSWAP_RELIABILITY_OUT set) runs the full size, over 10,000 inputs;
`make test` runs a few hundred, the same checks. The counts per kind of input and per
answer go to the `fuzz` section of docs/RELIABILITY.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from yarl import URL

from modelswap_sidecar.triton.process import free_loopback_port
from tests.support.agent_harness import MIB, TOKEN, AgentConfig, entry, new_uid, node
from tests.support.attached_toys import attach_toy
from tests.support.bursts import Expected, Outcomes, Reference, one_request, small_mlp_models
from tests.support.hostile_bodies import HostileInput, hostile_inputs
from tests.support.kube_testing import REPO_ROOT
from tests.support.reliability import OUT_ENV, record

pytestmark = [pytest.mark.slow, pytest.mark.asyncio, pytest.mark.timeout(900)]

#: The full run under `make reliability`, a small one under `make test`.
FULL = bool(os.environ.get(OUT_ENV))
GATEWAY_INPUTS = 8_000 if FULL else 300
CONTROL_INPUTS = 2_200 if FULL else 120
CHECK_EVERY = 250 if FULL else 50
SEED = 20261127
#: Gateway requests in flight at once.
CONCURRENCY = 6
#: The most any answer may take (a swap-in, a reload a generated request asked for, and a
#: queue included): longer is a hang. A reload first drains its model for up to
#: drainTimeoutSeconds (20 s, the built-in default), then unloads and loads it: a request
#: queued behind that may rightly wait longer than the drain alone.
ANSWER_SECONDS = 60.0
OTHER_WEIGHTS_BYTES = 2 * MIB
MAX_REVISION = 2**53 - 1
TOYS = ("batched", "tokens", "hashembed")
CRASH_MARKS = ("bad_alloc", "terminate called", "Aborted", "Segmentation fault", "core dumped")
OPENAPI = REPO_ROOT / "docs" / "control-api.openapi.yaml"


@dataclass
class Tally:
    """Answers by kind of input, and what broke the rules."""

    answers: Counter[tuple[str, str]] = field(default_factory=Counter)
    slowest_seconds: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: The last requests sent (seconds since the start, what), for a failure's message.
    recent: deque[tuple[float, str]] = field(default_factory=lambda: deque(maxlen=40))

    def sending(self, what: str) -> None:
        with self.lock:
            self.recent.append((round(time.monotonic(), 3), what[:300]))

    def add(self, kind: str, outcome: str, seconds: float, problem: str | None = None) -> None:
        with self.lock:
            self.answers[(kind, outcome)] += 1
            self.slowest_seconds[kind] = max(self.slowest_seconds.get(kind, 0.0), seconds)
            if problem is not None:
                self.problems.append(f"{kind}: {problem}")

    def inputs(self, kind: str) -> int:
        return sum(n for (k, _), n in self.answers.items() if k == kind)

    def kinds(self) -> list[str]:
        return sorted({k for k, _ in self.answers})


# -- the gateway's side -----------------------------------------------------------------------


def judge(status: int, retry_after: str | None) -> tuple[str, str | None]:
    """The outcome's name, and what is wrong with it (None: nothing)."""
    if status in (429, 503):
        if retry_after is None or not retry_after.isdigit():
            return str(status), f"{status} without a Retry-After"
        return f"{status} + Retry-After", None
    if status >= 500:
        return str(status), f"{status}"
    return str(status), None


async def send_gateway(
    http: aiohttp.ClientSession, base: str, sent: HostileInput, tally: Tally
) -> None:
    started = time.monotonic()
    tally.sending(f"{sent.kind}: {sent.method} {sent.path} {sent.body[:200]!r}{sent.raw!r:.200}")
    if sent.raw is not None:
        await send_raw(base, sent, tally)
        return
    try:
        async with http.request(
            sent.method,
            URL(base + sent.path, encoded=True),
            data=sent.body,
            headers=sent.headers,
            skip_auto_headers=("Content-Type",) if "Content-Type" in sent.headers else (),
        ) as r:
            text = await r.read()
            outcome, problem = judge(r.status, r.headers.get("Retry-After"))
            if problem is not None:
                problem += (
                    f" for {sent.method} {sent.path}: {text[:300]!r} (sent {sent.body[:300]!r})"
                )
    except TimeoutError:
        outcome, problem = "no answer", f"no answer in {ANSWER_SECONDS} s: {sent!r}"[:800]
    except aiohttp.ClientError as e:
        outcome, problem = "connection lost", f"{e!r} for {sent!r}"[:800]
    tally.add(sent.kind, outcome, time.monotonic() - started, problem)


async def send_raw(base: str, sent: HostileInput, tally: Tally) -> None:
    """The raw bytes (then a half-close, where asked), then whatever comes back until the
    server closes (each raw request says `Connection: close`)."""
    assert sent.raw is not None
    started = time.monotonic()
    url = URL(base)
    problem = None
    reader, writer = await asyncio.open_connection(url.host, url.port)
    try:
        writer.write(sent.raw)
        await writer.drain()
        if sent.half_close:
            writer.write_eof()
        answer = await asyncio.wait_for(reader.read(), ANSWER_SECONDS)
        if answer.startswith(b"HTTP/1."):
            status = int(answer[9:12])
            retry_after = None
            for line in answer.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"retry-after":
                    retry_after = value.strip().decode("latin-1")
            outcome, problem = judge(status, retry_after)
        elif not answer:
            outcome = "closed without an answer"
        else:
            outcome, problem = "not HTTP", f"answered {answer[:200]!r}"
    except TimeoutError:
        outcome, problem = "no answer", f"no answer in {ANSWER_SECONDS} s to {sent.raw[:300]!r}"
    except (ConnectionError, OSError):
        outcome = "connection reset"
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()
    if problem is not None:
        problem += f" (sent {sent.raw[:300]!r})"
    tally.add(sent.kind, outcome, time.monotonic() - started, problem)


# -- the control API's side -------------------------------------------------------------------


#: PUT /v1/desired's cases cost schemathesis ten times another's to draw (its DesiredSet
#: schema holds the CRD's spec): this share of the cases goes to it, the rest is spread
#: evenly over the other operations.
PUT_SHARE = 0.12
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


#: (HTTP method, the strategy drawing its cases) for one operation and generation mode
ControlPlan = tuple[str, st.SearchStrategy[schemathesis.Case]]


def control_plans() -> list[ControlPlan]:
    """The document's operations in both generation modes, in the order drawn; built in the
    test's own thread before the fuzz thread starts. schemathesis imports its modules as
    they are first needed, and pytest rewrites a plugin's modules (`ast.parse`) as they are
    imported; CPython 3.11.7 counts the AST conversion's recursion in state its threads
    share, so such an import in the fuzz thread, beside a parse in another thread, once
    failed with "AST constructor recursion depth mismatch" (CI)."""
    schema = schemathesis.openapi.from_path(OPENAPI)
    operations = [
        (result.ok(), mode)
        for result in schema.get_all_operations()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    ]
    # an operation with few distinct cases (GET /v1/openapi.yaml) first: what it cannot
    # draw goes to the ones after it
    operations.sort(key=lambda o: (o[0].path != "/v1/openapi.yaml", o[0].method == "put"))
    return [(op.method, op.as_strategy(generation_mode=mode)) for op, mode in operations]


@dataclass
class ControlFuzz:
    """schemathesis cases drawn for each operation of the document and generation mode in
    turn, each sent as soon as it is drawn (in this thread: the gateway is fuzzed meanwhile)."""

    base_url: str
    real_set: dict[str, Any]
    target_uids: list[str]
    tally: Tally
    sent: int = 0
    repushed: int = 0
    rng: random.Random = field(default_factory=lambda: random.Random(SEED))

    def run(self, total: int, plans: list[ControlPlan]) -> None:
        puts = sum(1 for method, _ in plans if method == "put")
        put_cases = max(1, round(total * PUT_SHARE / puts))
        left, others = total - put_cases * puts, len(plans) - puts
        with requests.Session() as session:
            session.trust_env = False
            for method, strategy in plans:
                if method == "put":
                    count = put_cases
                else:
                    count, others = max(1, left // others), others - 1
                before = self.sent
                self.draw_and_send(strategy, count, session)
                if method != "put":
                    left -= self.sent - before

    def draw_and_send(
        self, cases: st.SearchStrategy[schemathesis.Case], count: int, session: requests.Session
    ) -> None:
        @given(cases)
        @settings(
            max_examples=count,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        def each(case: schemathesis.Case) -> None:
            self.send(case, session)

        with contextlib.suppress(Unsatisfiable):  # GET /v1/openapi.yaml: nothing to break
            each()

    def send(self, case: schemathesis.Case, session: requests.Session) -> None:
        """One case, its answer checked against the document; never raises (a failure
        inside hypothesis's loop would have it shrink the case, minutes on two cores)."""
        if "uid" in case.path_parameters and self.rng.random() < 0.3:
            case.path_parameters["uid"] = self.rng.choice(self.target_uids)
        headers = {}
        if self.rng.random() < 0.7:
            headers["Authorization"] = f"Bearer {TOKEN}"
        kind = f"control API {case.method} {case.path}"
        self.tally.sending(f"{kind} {case.path_parameters} {case.query} {bool(headers)}")
        started = time.monotonic()
        problem = None
        try:
            response = case.call(
                base_url=self.base_url, session=session, headers=headers, timeout=ANSWER_SECONDS
            )
            outcome = str(response.status_code)
            if case.path == "/v1/openapi.yaml":
                # Its body is this very document (YAML), which schemathesis would parse and
                # then hold against the `type: string` it is described as.
                if response.status_code != 200 or response.text != OPENAPI.read_text():
                    problem = f"GET /v1/openapi.yaml: {response.status_code}"
            else:
                try:
                    case.validate_response(response, checks=CHECKS, headers=headers)
                except FailureGroup as e:
                    problem = f"{case.as_curl_command(headers=headers)}: {e}"[:1500]
        except requests.RequestException as e:
            outcome, problem = "no answer", f"{e!r}: {case.as_curl_command(headers=headers)}"
        self.tally.add(kind, outcome, time.monotonic() - started, problem)
        self.sent += 1
        if case.method == "PUT" and outcome == "200":
            self.push_real_set(session)

    def push_real_set(self, session: requests.Session) -> None:
        """A generated set at the node's revision was taken: the real one back at once."""
        r = session.put(
            self.base_url + "/v1/desired",
            json=self.real_set,
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=ANSWER_SECONDS,
        )
        if r.status_code != 200:
            self.tally.problems.append(f"pushing the real set back: {r.status_code} {r.text}")
        self.repushed += 1


# -- the run ---------------------------------------------------------------------------------


def models_folder(tmp_path: Path) -> Path:
    """examples/models/mlp (a 2 MiB region) and the toys, attaching."""
    root = small_mlp_models(tmp_path, OTHER_WEIGHTS_BYTES)
    for toy in TOYS:
        attach_toy(root, toy, execute_in_use=False, close_on_finalize=True)
    return root


async def other_answers(gateway_url: str, reference: Reference, seed: int) -> str | None:
    """None when `other` answers input `seed` correctly, else what it did."""
    outcomes = Outcomes()
    async with httpx.AsyncClient(base_url=gateway_url, trust_env=False) as http:
        expected = Expected("other", reference.checksum(OTHER_WEIGHTS_BYTES))
        await one_request(http, reference, expected, seed, outcomes, timeout_seconds=ANSWER_SECONDS)
    if outcomes.ok == 1:
        return None
    return repr((outcomes.wrong, outcomes.hung, outcomes.refusal_reasons))


async def test_fuzzed_gateway_and_control_api_leave_the_node_serving(tmp_path: Path) -> None:
    began = time.monotonic()
    gateway_port = free_loopback_port()
    config = AgentConfig(
        gpu_bytes=(256 * MIB,),
        extra={
            "gateway": {"host": "127.0.0.1", "port": gateway_port},
            "modelRoots": {"/models": str(models_folder(tmp_path))},
        },
    )
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    reference = Reference()
    uids = {name: new_uid() for name in ("other", *TOYS)}
    entries = [entry(uids["other"], name="other", weights="2Mi")]
    entries += [entry(uids[toy], model=toy, name=toy, weights="1Mi") for toy in TOYS]
    tally = Tally()
    async with node(tmp_path, config) as n:
        triton, agent, control, _models = n.parts()
        control.term, control.counter = MAX_REVISION, MAX_REVISION - 1
        await control.desired(entries)
        for uid in uids.values():
            await control.wait_state(uid, "Resident", timeout_seconds=120)
        triton_pid, agent_pid = triton.pid, agent.pid
        assert await other_answers(gateway_url, reference, 0) is None
        fuzz = ControlFuzz(
            agent.base_url,
            {"revision": {"term": MAX_REVISION, "counter": MAX_REVISION}, "entries": entries},
            [uids[toy] for toy in TOYS],
            tally,
        )
        died: list[str] = []

        def watch_triton() -> None:
            """What was sent last when Triton's process ended (it must not, before the
            test ends it)."""
            assert triton.process is not None
            code = triton.process._popen.wait()
            if not died:
                died.append(f"Triton exited ({code}) at {time.monotonic():.3f}; last sent: "
                            + "\n".join(f"{t}: {w}" for t, w in list(tally.recent)))  # fmt: skip

        watcher = threading.Thread(target=watch_triton, daemon=True)
        watcher.start()
        plans = control_plans()
        control_run = asyncio.create_task(asyncio.to_thread(fuzz.run, CONTROL_INPUTS, plans))
        other_checks: list[str | None] = []
        inputs: Iterator[HostileInput] = hostile_inputs(SEED, GATEWAY_INPUTS)
        sent = 0
        timeout = aiohttp.ClientTimeout(total=ANSWER_SECONDS)
        connector = aiohttp.TCPConnector(limit=CONCURRENCY, force_close=False)
        async with aiohttp.ClientSession(
            timeout=timeout, connector=connector, auto_decompress=True
        ) as http:

            async def worker() -> None:
                nonlocal sent
                for one in inputs:  # shared: each input goes to one worker
                    sent += 1
                    if sent % CHECK_EVERY == 0:
                        other_checks.append(await other_answers(gateway_url, reference, sent % 16))
                    await send_gateway(http, gateway_url, one, tally)

            await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        await control_run
        other_checks.append(await other_answers(gateway_url, reference, 1))
        fuzz_seconds = time.monotonic() - began
        # the same processes, and nothing in Triton's log says it aborted
        assert not died, died[0]
        assert triton.process is not None and triton.process.returncode() is None
        assert triton.pid == triton_pid, "Triton was restarted"
        assert agent.popen is not None and agent.popen.poll() is None and agent.pid == agent_pid
        triton_log = triton.log_path.read_text(errors="replace")
        crashes = [mark for mark in CRASH_MARKS if mark in triton_log]
        for uid in uids.values():  # every model serves (a generated reload may be ending)
            await control.wait_state(uid, "Resident", "SwappedOut", timeout_seconds=60)

    gateway_total = sum(tally.inputs(k) for k in tally.kinds() if not k.startswith("control"))
    control_total = sum(tally.inputs(k) for k in tally.kinds() if k.startswith("control"))
    for kind in tally.kinds():
        answers = {o: n for (k, o), n in sorted(tally.answers.items()) if k == kind}
        record(
            "fuzz",
            input=kind,
            tried=tally.inputs(kind),
            answers=", ".join(f"{n:,} x {o}" for o, n in answers.items()),
            slowest_seconds=round(tally.slowest_seconds[kind], 3),
            problems=sum(1 for p in tally.problems if p.startswith(f"{kind}: ")),
        )
    record(
        "fuzz",
        input=f"all (seed {SEED}, schemathesis {schemathesis.__version__}): gateway "
        f"{gateway_total:,} + control API {control_total:,}",
        tried=gateway_total + control_total,
        answers=(
            f"other answered right {sum(c is None for c in other_checks)} of "
            f"{len(other_checks)} checks; Triton pid unchanged, "
            f"{f'its log says {crashes}' if crashes else 'no abort in its log'}; "
            f"real set pushed back {fuzz.repushed} times"
        ),
        slowest_seconds=round(max(tally.slowest_seconds.values()), 3),
        problems=len(tally.problems),
        run_seconds=round(fuzz_seconds, 1),
    )
    assert tally.problems == [], "\n".join(tally.problems[:20])
    assert not crashes, f"Triton's log says {crashes}"
    assert all(c is None for c in other_checks), other_checks
    assert gateway_total == GATEWAY_INPUTS and control_total >= CONTROL_INPUTS * 0.95
    if FULL:
        assert gateway_total + control_total >= 10_000
