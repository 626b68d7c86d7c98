"""Packing a PyTorch module into a region: its weights swap with the model.

    from modelswap_client import torch as mstorch
    model = mstorch.from_pretrained(att, AutoModel, "/models/minilm")   # Hugging Face
    model = mstorch.load_module(att, build, load_state)                 # any nn.Module

Every parameter and buffer is laid out in the region once (each tensor aligned to
`ALIGNMENT_BYTES`, tied weights once) and the module is rebound to views of the region at
stable addresses, so the agent can page the region out and back while the module (and a
CUDA graph over it) stays valid. The layout's fingerprint (names, shapes, dtypes,
offsets, and where known the weight files' identity) is committed with the bytes: a
restarted model process builds its module with parameters on the meta device
(`empty_parameters`) and binds the committed bytes without reading its weight files
(`bind`); a model whose code or weights changed since the commit loads afresh and commits
again, and logs that it did.

Works on every mapper: the sim backend's regions are CPU tensors, `cuda-vmm` and `managed`
regions CUDA tensors (DLPack). Not paged: activations, workspaces and anything torch
allocates outside the region (its caching allocator); a module's Python objects.

torch is imported at use: importing this module needs only the standard library.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelswap_api.wire import ErrorCode
from modelswap_client.errors import ClientError

if TYPE_CHECKING:
    from modelswap_client.client import Attachment

__all__ = [
    "ALIGNMENT_BYTES",
    "Layout",
    "adopt",
    "bind",
    "empty_parameters",
    "fingerprint_matches",
    "from_pretrained",
    "layout_of",
    "load_module",
    "required_bytes",
    "source_identity",
]

log = logging.getLogger(__name__)

#: every tensor starts at a multiple of this (CUDA's allocation alignment is 256 bytes;
#: vectorised kernels assume no more)
ALIGNMENT_BYTES = 256
FINGERPRINT_VERSION = "v1"
WEIGHT_SUFFIXES = (".safetensors",)


def _align(n: int) -> int:
    return -(-n // ALIGNMENT_BYTES) * ALIGNMENT_BYTES


@dataclass(frozen=True)
class Slot:
    """One tensor's place in the region. `owners` are the (module, attribute) pairs that
    hold it (several for tied weights); `names` their dotted names, the first canonical."""

    names: tuple[str, ...]
    is_parameter: bool
    shape: tuple[int, ...]
    dtype: str  # torch's name, e.g. "float32"
    offset_bytes: int
    size_bytes: int
    owners: tuple[tuple[Any, str], ...]
    tensor: Any  # the tensor the module holds now (meta when built by empty_parameters)


@dataclass(frozen=True)
class Layout:
    """Where each of a module's tensors lies in a region, and the bytes they need."""

    slots: tuple[Slot, ...]
    total_bytes: int

    def digest(self) -> str:
        """sha256 of what a bound module depends on: names, kinds, shapes, dtypes, offsets."""
        doc = [
            [list(s.names), s.is_parameter, list(s.shape), s.dtype, s.offset_bytes]
            for s in self.slots
        ]
        text = json.dumps([self.total_bytes, doc], separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def fingerprint(self, source: str = "") -> str:
        """What is committed with the bytes: the layout digest and the source identity."""
        return f"{FINGERPRINT_VERSION};layout={self.digest()};source={source}"


def _parse(fingerprint: str) -> dict[str, str]:
    version, _, rest = fingerprint.partition(";")
    if version != FINGERPRINT_VERSION:
        return {}
    return dict(part.partition("=")[::2] for part in rest.split(";"))


def fingerprint_matches(committed: str, layout: Layout, source: str = "") -> bool:
    """True when bytes committed under `committed` fit `layout`: the layouts are the same,
    and the sources too where both are known (weight files moved away after the commit
    are unknown, not changed)."""
    theirs = _parse(committed)
    if theirs.get("layout") != layout.digest():
        return False
    old_source = theirs.get("source", "")
    return not (source and old_source and source != old_source)


def source_identity(paths: list[Path]) -> str:
    """A short identity of weight files (names, sizes, modification times), "" when any is
    missing: reading them whole to hash them would cost what binding saves."""
    parts = []
    for path in sorted(paths):
        try:
            st = path.stat()
        except OSError:
            return ""
        parts.append(f"{path.name}:{st.st_size}:{st.st_mtime_ns}")
    if not parts:
        return ""
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def _torch() -> Any:
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415
    except ImportError as e:  # pragma: no cover - the message is the point
        raise ClientError(
            f"modelswap_client.torch needs PyTorch in the model's environment ({e})",
            ErrorCode.BAD_REQUEST,
        ) from e
    return torch


def layout_of(module: Any) -> Layout:
    """Lay out every parameter and buffer of `module` (each distinct tensor once, in the
    order `named_modules` visits them, aligned to `ALIGNMENT_BYTES`)."""
    by_id: dict[int, dict[str, Any]] = {}
    order: list[dict[str, Any]] = []
    for prefix, sub in module.named_modules():
        for is_parameter, table in ((True, sub._parameters), (False, sub._buffers)):
            for leaf, t in table.items():
                if t is None:
                    continue
                name = f"{prefix}.{leaf}" if prefix else leaf
                entry = by_id.get(id(t))
                if entry is None:
                    entry = {"names": [], "owners": [], "tensor": t, "param": is_parameter}
                    by_id[id(t)] = entry
                    order.append(entry)
                entry["names"].append(name)
                entry["owners"].append((sub, leaf))
    slots = []
    offset = 0
    for entry in order:
        t = entry["tensor"]
        size = t.numel() * t.element_size()
        slots.append(
            Slot(
                tuple(entry["names"]),
                entry["param"],
                tuple(int(d) for d in t.shape),
                str(t.dtype).removeprefix("torch."),
                offset,
                size,
                tuple(entry["owners"]),
                t,
            )
        )
        offset = _align(offset + size)
    return Layout(tuple(slots), offset)


def required_bytes(module: Any) -> int:
    """Bytes `module`'s parameters and buffers need in a region (alignment included, tied
    weights once): the least `weightsBytes` that holds it."""
    return layout_of(module).total_bytes


def _region(att: Attachment, tag: str, layout: Layout) -> Any:
    regions = att.regions
    if tag not in regions:
        raise ClientError(
            f"no region {tag!r} in this attachment (it has {sorted(regions)})",
            ErrorCode.BAD_REQUEST,
        )
    region = regions[tag]
    if layout.total_bytes > region.size_bytes:
        mib = -(-layout.total_bytes // (1 << 20))
        raise ClientError(
            f"region {tag!r} holds {region.size_bytes} bytes; this module needs "
            f"{layout.total_bytes} (set spec.model.weightsBytes to at least {mib}Mi)",
            ErrorCode.BAD_REQUEST,
        )
    return region


def _views(region: Any, layout: Layout) -> list[Any]:
    """A tensor over the region at each slot's offset, with its dtype and shape (no copy)."""
    torch = _torch()
    base = region.torch()  # uint8, on the region's device
    views = []
    for s in layout.slots:
        raw = base[s.offset_bytes : s.offset_bytes + s.size_bytes]
        views.append(raw.view(getattr(torch, s.dtype)).view(s.shape))
    return views


def _rebind(layout: Layout, views: list[Any]) -> None:
    """Point every owner of each slot at its view: parameters become new Parameters over
    the view (one per slot, so tied weights stay one object), buffers the view itself."""
    torch = _torch()
    for s, view in zip(layout.slots, views, strict=True):
        value = torch.nn.Parameter(view, requires_grad=False) if s.is_parameter else view
        for owner, leaf in s.owners:
            if s.is_parameter:
                owner._parameters[leaf] = value
            else:
                owner._buffers[leaf] = value


def _synchronize(region: Any) -> None:
    if region.on_device:
        _torch().cuda.synchronize(region.device_ordinal)


def adopt(att: Attachment, module: Any, region: str = "weights", *, source: str = "") -> None:
    """Copy every parameter and buffer of a loaded `module` into the region once, rebind
    the module to views of it, and commit the bytes with the layout's fingerprint.
    `source`: an identity of the weights (`source_identity`), kept in the fingerprint."""
    layout = layout_of(module)
    target = _region(att, region, layout)
    on_meta = [s.names[0] for s in layout.slots if s.tensor.device.type == "meta"]
    if on_meta:
        raise ClientError(
            f"cannot adopt a module with tensors on the meta device ({', '.join(on_meta[:5])}"
            f"{' ...' if len(on_meta) > 5 else ''}): load its weights first",
            ErrorCode.BAD_REQUEST,
        )
    with att.in_use():
        views = _views(target, layout)
        for s, view in zip(layout.slots, views, strict=True):
            view.copy_(s.tensor.detach().reshape(s.shape))
        _rebind(layout, views)
        _synchronize(target)
        att.commit(layout.fingerprint(source), replace=att.committed)


def bind(att: Attachment, module: Any, region: str = "weights", *, source: str = "") -> bool:
    """Rebind `module` (built with its parameters on the meta device) to the host copy the
    agent restored: True when the committed fingerprint matches the module's layout (and
    `source`, where both are known). False when there is nothing restored, or it is
    stale: load afresh (`load_module` does both)."""
    layout = layout_of(module)
    if not (att.restored and att.committed):
        return False
    if not fingerprint_matches(att.fingerprint, layout, source):
        return False
    _rebind(layout, _views(_region(att, region, layout), layout))
    return True


@contextlib.contextmanager
def empty_parameters() -> Iterator[None]:
    """Build modules with their parameters on the meta device (no memory, no init work)
    and their buffers real: buffers that no checkpoint holds (rotary frequencies, position
    ids) are computed by the module's own constructor."""
    torch = _torch()
    module_cls = torch.nn.Module
    register = module_cls.register_parameter

    def register_on_meta(self: Any, name: str, param: Any) -> None:
        register(self, name, param)
        p = self._parameters.get(name)
        if p is not None and p.device.type != "meta":
            self._parameters[name] = type(p)(p.to("meta"), requires_grad=p.requires_grad)

    module_cls.register_parameter = register_on_meta
    try:
        yield
    finally:
        module_cls.register_parameter = register


def load_module(
    att: Attachment,
    build: Callable[[], Any],
    load_state: Callable[[Any], None],
    region: str = "weights",
    *,
    source: str = "",
) -> Any:
    """The module, from the host copy when one fits, else loaded and committed.

    `build()` makes the module (it runs inside `empty_parameters`: parameters on meta);
    `load_state(module)` fills it in place when there is no usable host copy — its
    tensors are then already views of the region, so `module.load_state_dict(sd)` (which
    copies in place) writes straight into it. Returns the module in eval mode."""
    with empty_parameters():
        module = build()
    layout = layout_of(module)
    target = _region(att, region, layout)
    if bind(att, module, region, source=source):
        log.info(
            "%s: bound the host copy (%d bytes), no weight file read", att.model, layout.total_bytes
        )
        return module.eval()
    if att.restored:
        log.warning(
            "%s: the host copy was committed by another layout or other weights (%s; this "
            "model is %s): loading afresh and committing again",
            att.model,
            att.fingerprint or "no fingerprint",
            layout.fingerprint(source),
        )
    with att.in_use():
        views = _views(target, layout)
        for s, view in zip(layout.slots, views, strict=True):
            if s.tensor.device.type != "meta":  # a real buffer: its constructor's value
                view.copy_(s.tensor.detach().reshape(s.shape))
        _rebind(layout, views)
        load_state(module)
        _synchronize(target)
        att.commit(layout.fingerprint(source), replace=att.committed)
    log.info("%s: loaded and committed %d bytes", att.model, layout.total_bytes)
    return module.eval()


# -- Hugging Face ---------------------------------------------------------------------------


def _checkpoint_files(folder: Path) -> dict[str, Path]:
    """Tensor name → safetensors file in a Hugging Face folder (single or sharded)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return {name: folder / file for name, file in weight_map.items()}
    single = folder / "model.safetensors"
    if not single.is_file():
        raise ClientError(
            f"{folder}: no model.safetensors (or model.safetensors.index.json) to load from",
            ErrorCode.BAD_REQUEST,
        )
    from safetensors import safe_open  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415

    with safe_open(str(single), framework="pt", device="cpu") as f:
        return dict.fromkeys(f.keys(), single)


def _checkpoint_name(names: tuple[str, ...], prefix: str, keys: dict[str, Path]) -> str | None:
    """The checkpoint key of a tensor known by `names`: as named, with the base model's
    prefix added, or with it removed (a base model loaded from a task model's file)."""
    for name in names:
        candidates = (
            (name, f"{prefix}.{name}", name.removeprefix(f"{prefix}.")) if prefix else (name,)
        )
        for candidate in candidates:
            if candidate in keys:
                return candidate
    return None


def _load_safetensors(module: Any, folder: Path) -> None:
    """Copy each tensor the module holds from `folder`'s safetensors into it, in place,
    one tensor at a time (no second copy of the model in memory). Buffers not in the
    checkpoint keep their constructor's value; a missing parameter is an error."""
    from safetensors import safe_open  # noqa: PLC0415

    keys = _checkpoint_files(folder)
    prefix = str(getattr(module, "base_model_prefix", "") or "")
    wanted: dict[Path, list[tuple[str, Slot]]] = {}
    missing = []
    for s in layout_of(module).slots:
        key = _checkpoint_name(s.names, prefix, keys)
        if key is None:
            if s.is_parameter:
                missing.append(s.names[0])
            continue
        wanted.setdefault(keys[key], []).append((key, s))
    if missing:
        raise ClientError(
            f"{folder}: the checkpoint has no tensor for {len(missing)} parameter(s): "
            f"{', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}",
            ErrorCode.BAD_REQUEST,
        )
    for path, items in wanted.items():
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for key, s in items:
                value = f.get_tensor(key)
                if tuple(value.shape) != s.shape:
                    raise ClientError(
                        f"{path.name}: {key} has shape {tuple(value.shape)}, the model's "
                        f"{s.names[0]} {s.shape}",
                        ErrorCode.BAD_REQUEST,
                    )
                s.tensor.copy_(value)


def hf_source_identity(folder: Path) -> str:
    """The identity of a Hugging Face folder's weight files ("" when they are gone)."""
    return source_identity([p for p in folder.glob("*") if p.name.endswith(WEIGHT_SUFFIXES)])


def build_pretrained(cls: Any, folder: str | os.PathLike[str], **kwargs: Any) -> Any:
    """`cls` built from `folder`'s config (no weights read): Auto classes through
    `from_config`, model classes through their constructor. `dtype` (or `torch_dtype`)
    casts the floating-point parameters; other keyword arguments update the config."""
    from transformers import AutoConfig  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415

    torch = _torch()
    dtype = kwargs.pop("dtype", None) or kwargs.pop("torch_dtype", None)
    config = AutoConfig.from_pretrained(str(folder), **kwargs)
    model = cls.from_config(config) if hasattr(cls, "from_config") else cls(config)
    if dtype is not None:
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        for p in model.parameters():
            if p.is_floating_point():
                p.data = p.data.to(dtype)
    return model


def from_pretrained(
    att: Attachment,
    cls: Any,
    path: str | os.PathLike[str],
    region: str = "weights",
    **kwargs: Any,
) -> Any:
    """A Hugging Face model in the region: `cls` (e.g. `AutoModel`, `LlamaForCausalLM`)
    built from `path`'s config with its parameters on meta, then bound to the host copy
    when one fits (no weight file is read), else loaded from `path`'s safetensors straight
    into the region and committed. Returns the model in eval mode."""
    folder = Path(path)
    return load_module(
        att,
        lambda: build_pretrained(cls, folder, **kwargs),
        lambda module: _load_safetensors(module, folder),
        region,
        source=hf_source_identity(folder),
    )
