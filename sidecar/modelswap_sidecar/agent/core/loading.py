"""Side effects of loading and unloading one model: source, engine registration, Triton.

    load(model)     resolve spec.model.source (mounted roots mapped, credentials as an
                    Authorization header, `credentials.headers` as given), read its
                    config.pbtxt (a non-python backend cannot attach: served with drop
                    semantics), register the model with the engine on its GPU, and load
                    it into Triton with ModelswapParameters so the stub's client attaches
                    (restored from the host store when the engine holds a copy; else it
                    loads from the source and commits)
                    (the engine applies `onSwapOut`, `kv` and the tiered KV pool's settings)
    unload(model)   unload from Triton (the stub exits; the engine keeps the host copy) and
                    release the source-cache entry
    unload_dead(model)  the same for a model whose processes died, waiting only briefly
                    (an unload holding a dead process's request never ends)

Local mode's dev loop: a dev model (`dev_models` names it) is registered with the engine
and never loaded into Triton; the developer's own process attaches as it.

Failures raise `LoadError` with a CamelCase reason and a message naming the field.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import re
from collections.abc import Callable, Mapping
from pathlib import Path

from modelswap_api.control import SourceCredentials
from modelswap_api.models import Source
from modelswap_api.wire import KvMode, SwapOutMode
from modelswap_sidecar.agent.core.records import DEV_RUNTIME, AgentModel
from modelswap_sidecar.agent.errors import LoadError
from modelswap_sidecar.engine.core import Engine
from modelswap_sidecar.engine.errors import EngineError
from modelswap_sidecar.engine.records import ModelConfig
from modelswap_sidecar.policy.kv import kv_pool_settings
from modelswap_sidecar.sources.errors import FIELD as SOURCE_FIELD
from modelswap_sidecar.sources.errors import CredentialsInvalid, SourceError
from modelswap_sidecar.sources.resolver import SourceResolver
from modelswap_sidecar.triton.config import ModelswapParameters, read_model_config
from modelswap_sidecar.triton.driver import TritonDriver
from modelswap_sidecar.triton.errors import ModelConfigInvalid, TritonError

log = logging.getLogger(__name__)

PYTHON_BACKEND = "python"


def map_source(source: Source, model_roots: Mapping[str, Path]) -> Source:
    """A mounted source's path as this host sees it (`/models/x` → `<root>/x`)."""
    if source.is_url:
        return source
    for prefix, root in sorted(model_roots.items(), key=lambda kv: -len(kv[0])):
        stem = prefix.rstrip("/")
        if source.uri == stem or source.uri.startswith(stem + "/"):
            return dataclasses.replace(source, uri=str(root) + source.uri[len(stem) :])
    return source


#: Characters a credential may not hold once trimmed: they would split or end the header.
_HEADER_BREAKERS = frozenset("\r\n\0")


def _credential(value: str, what: str) -> str:
    """`value` without surrounding whitespace (a Secret made from a file often ends in a
    newline); CredentialsInvalid naming `what` — never the value — when CR, LF or NUL
    remain inside it."""
    trimmed = value.strip()
    if any(c in _HEADER_BREAKERS for c in trimmed):
        raise CredentialsInvalid(
            f"the {what} holds a line break or NUL inside it and cannot be sent as a header; "
            "fix the Secret"
        )
    return trimmed


def authorization_of(credentials: SourceCredentials | None) -> str | None:
    """The Authorization header value for the operator-resolved credentials (never logged);
    surrounding whitespace is dropped, CredentialsInvalid for a value a header cannot
    carry."""
    if credentials is None:
        return None
    if credentials.bearer_token and credentials.bearer_token.strip():
        return f"Bearer {_credential(credentials.bearer_token, 'bearer token')}"
    if credentials.username is not None and credentials.password is not None:
        username = _credential(credentials.username, "username")
        password = _credential(credentials.password, "password")
        pair = f"{username}:{password}".encode()
        return "Basic " + base64.b64encode(pair).decode()
    for key, value in (credentials.headers or {}).items():
        if key.strip().lower() == "authorization":
            return _credential(value, "authorization header")
    return None


#: An HTTP header name (RFC 9110 token).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")
#: Headers the fetch itself owns (framing, connection, target): a credential may not set them.
_FETCH_OWNS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "te",
     "trailer", "upgrade", "proxy-connection", "expect"}
)  # fmt: skip


def source_headers_of(credentials: SourceCredentials | None) -> dict[str, str]:
    """`credentials.headers` other than `authorization` (which `authorization_of` sends),
    values trimmed; CredentialsInvalid naming `credentials.headers.<name>` — never the value
    — for one a request cannot carry."""
    headers: dict[str, str] = {}
    for key, value in ((credentials.headers or {}) if credentials else {}).items():
        name = key.strip()
        if name.lower() == "authorization":
            continue
        if _HEADER_NAME.fullmatch(name) is None or name.lower() in _FETCH_OWNS:
            raise CredentialsInvalid(
                f"credentials.headers.{ascii(name)[1:-1][:128]}: not a header a source "
                "request may carry; fix the Secret"
            )
        headers[name] = _credential(value, f"credentials.headers.{name} value")
    return headers


def engine_config(model: AgentModel) -> ModelConfig:
    """The engine's view of a placed model: its GPU, the policy fields the engine applies
    itself (KV mode, pinning, priority, drop on swap-out) and the tiered KV pool's settings
    (only for a model with a KV region)."""
    assert model.gpu is not None
    kv = kv_pool_settings(model.policy, model.kv_cache_bytes)
    has_kv = model.kv_cache_bytes > 0
    return ModelConfig(
        model.triton_name,
        model.gpu,
        KvMode(model.policy.kv),
        on_swap_out=SwapOutMode(model.policy.on_swap_out),
        kv_offload_after_tokens=kv.offload_after_tokens if has_kv else None,
        kv_host_bytes=kv.host_bytes if has_kv else 0,
    )


class ModelLoader:
    def __init__(
        self,
        *,
        engine: Engine,
        driver: TritonDriver,
        resolver: SourceResolver,
        socket_path: Path,
        model_roots: Mapping[str, Path],
        mapper: str = "sim",
        gpu_uuids: tuple[str, ...] = (),
        dev_models: Callable[[], frozenset[str]] | None = None,
    ) -> None:
        """`dev_models`: local mode's dev loop (engine names of the models a developer's
        own process serves: registered with the engine, never loaded into Triton); None
        outside it."""
        self.engine = engine
        self.driver = driver
        self.resolver = resolver
        self.socket_path = socket_path
        self.model_roots = model_roots
        self.mapper = mapper
        #: by engine GPU index; sent as `modelswap.gpu_uuid` (device mappers), none for sim
        self.gpu_uuids = gpu_uuids
        self.dev_models = dev_models

    async def resolve(self, model: AgentModel) -> Path:
        if model.resolved is None:
            source = map_source(model.entry.spec.model.source, self.model_roots)
            try:
                credentials = model.entry.credentials
                model.resolved = await self.resolver.resolve(
                    source,
                    authorization=authorization_of(credentials),
                    headers=source_headers_of(credentials),
                )
            except SourceError as e:
                raise LoadError("BadSource", str(e)) from e
        return model.resolved.model_dir

    def parameters(self, model: AgentModel) -> ModelswapParameters:
        """What the stub reads from its config (nothing secret: Triton serves it to anyone).
        The KV pool's settings travel with the engine's attach reply instead."""
        assert model.gpu is not None
        return ModelswapParameters(
            uid=model.uid,
            gpu_ordinal=model.gpu,
            weights_bytes=model.weights_bytes,
            kv_cache_bytes=model.kv_cache_bytes,
            agent_socket=str(self.socket_path),
            mapper=self.mapper,
            gpu_uuid=self.gpu_uuids[model.gpu] if model.gpu < len(self.gpu_uuids) else None,
        )

    def is_dev(self, model: AgentModel) -> bool:
        """Whether local mode's dev loop names `model` a dev model (read at each load)."""
        return self.dev_models is not None and model.triton_name in self.dev_models()

    async def load(self, model: AgentModel) -> None:
        """Load `model` (placed: `gpu` set) into Triton; LoadError on failure. A dev model
        is only registered with the engine: the developer's process attaches as it (its
        source is not read)."""
        if self.is_dev(model):
            model.attaches, model.runtime_backend = True, DEV_RUNTIME
            try:
                await asyncio.to_thread(self.engine.add_model, engine_config(model))
            except EngineError as e:
                raise LoadError("EngineRefused", str(e)) from e
            log.info("dev model %s: waiting for its process to attach", model.triton_name)
            return
        model_dir = await self.resolve(model)
        try:
            config = await asyncio.to_thread(read_model_config, model_dir)
        except ModelConfigInvalid as e:
            raise LoadError("BadSource", f"{SOURCE_FIELD}: {e}") from e
        model.attaches = config.backend == PYTHON_BACKEND
        model.runtime_backend = config.backend or config.platform or "unknown"
        if model.attaches:
            try:
                await asyncio.to_thread(self.engine.add_model, engine_config(model))
            except EngineError as e:
                raise LoadError("EngineRefused", str(e)) from e
        else:
            log.info(
                "model %s (%s backend) cannot attach: served with onSwapOut: drop",
                model.uid,
                config.backend or config.platform,
            )
        try:
            await self.driver.load(model.uid, model_dir, self.parameters(model))
        except TritonError as e:
            raise LoadError("LoadFailed", str(e)) from e

    async def unload(self, model: AgentModel, *, release_source: bool = True) -> None:
        if not model.dev:  # a dev model was never loaded into Triton
            await self.driver.unload(model.uid)
        if release_source and model.resolved is not None:
            self.resolver.release(model.resolved)
            model.resolved = None

    async def unload_dead(self, model: AgentModel) -> bool:
        """Out of Triton after its runtime processes died (`TritonDriver.unload_dead`: a
        short wait, since an unload that holds a request of the dead process never ends);
        the source-cache entry is kept for the load that follows. Whether Triton finished."""
        if model.dev:  # a dev model was never loaded into Triton
            return True
        return await self.driver.unload_dead(model.uid)
