"""Records every call modelswap makes into `cuda.bindings`, real or fake, in a form two runs
can compare (standard library only: it runs on GPU machines that have nothing installed).

Enabled only through `modelswap_client.cuda_compat`'s seam::

    MODELSWAP_CUDA_WRAP=tests.support.cuda_recorder:wrap      # cuda_compat.load() wraps
    MODELSWAP_CUDA_RECORD=/out/cuda-vmm                       # file prefix (optional)
    MODELSWAP_CUDA_RECORD_ROLE=agent                          # this process's role

Each process appends one JSON line per call to `<prefix>.<role>.jsonl` as the call returns
(a crash mid-cycle still leaves every call before it), after a first line with the
bindings' version. Without `MODELSWAP_CUDA_RECORD` the calls are only kept in memory
(`recorder().calls(role)`). A thread may record under another role
(`with recorder().role("client"):`), which is how the fake runs the model process's side
in a thread of the agent's process (the fake cannot span processes).

A call is recorded as ``{"fn", "api", "args", "code", "out"}`` (or ``"raised"`` instead of
code/out when the bindings raised), normalised so that runs compare:

- enums by name (``"CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED"``); ints, bools and
  floats as values; bytes as ``{"bytes": text}``;
- handles (streams, events, contexts, allocation handles…) as ``"$CUstream#1"``: a symbol
  per type, numbered in order of first appearance; a result always gets a fresh symbol and
  a successful destroy/release retires it, so values the driver reuses never alias;
  ``CUdevice`` keeps its ordinal (``"CUdevice(0)"``);
- addresses (the argument positions `ARG_ROLES` names) relative to a known region:
  ``"$va#1+0x4000000"`` (a reservation), ``"$managed#1"``, ``"$host#2+0x0"`` (a host
  range first seen in a register call, sized by that call); a pointer object keeps its
  type: ``"CUdeviceptr($va#1)"``;
- file descriptors as ``"$fd#n"`` (a fresh symbol at every appearance: closes are not
  CUDA calls, so a number's reuse cannot be seen);
- structs as ``{"struct": type, field: …}`` with the fields `STRUCT_FIELDS` lists (others
  with every public plain attribute).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

RECORD_ENV = "MODELSWAP_CUDA_RECORD"
ROLE_ENV = "MODELSWAP_CUDA_RECORD_ROLE"
WRAP_SPEC = "tests.support.cuda_recorder:wrap"  # the value for cuda_compat.WRAP_ENV

#: argument roles by position: "ptr" a device (or managed) address, "hptr" a host address,
#: "size" a byte count (also the size of a region first seen in that call), "fd" a file
#: descriptor; positions not named are normalised by their type alone
ARG_ROLES: dict[str, tuple[str | None, ...]] = {
    "cuMemAddressReserve": ("size", None, "ptr", None),
    "cuMemAddressFree": ("ptr", "size"),
    "cuMemMap": ("ptr", "size", None, None, None),
    "cuMemUnmap": ("ptr", "size"),
    "cuMemSetAccess": ("ptr", "size", None, None),
    "cuMemRetainAllocationHandle": ("ptr",),
    "cuMemImportFromShareableHandle": ("fd", None),
    "cuMemHostRegister": ("hptr", "size", None),
    "cuMemHostUnregister": ("hptr",),
    "cuMemcpyHtoDAsync": ("ptr", "hptr", "size", None),
    "cuMemcpyDtoHAsync": ("hptr", "ptr", "size", None),
    "cuMemcpyDtoDAsync": ("ptr", "ptr", "size", None),
    "cuMemcpyAsync": ("ptr", "ptr", "size", None),
    "cuMemcpyHtoD": ("ptr", "hptr", "size"),
    "cuMemcpyDtoH": ("hptr", "ptr", "size"),
    "cuMemFree": ("ptr",),
    "cuMemFreeHost": ("hptr",),
    "cuMemPrefetchAsync": ("ptr", "size"),
    "cuMemAdvise": ("ptr", "size"),
    "cudaMemPrefetchAsync": ("ptr", "size"),
    "cudaMemAdvise": ("ptr", "size"),
    "cudaMemcpyAsync": ("ptr", "ptr", "size"),
    "cudaHostRegister": ("hptr", "size", None),
    "cudaHostUnregister": ("hptr",),
    "cudaFree": ("ptr",),
}

#: calls whose first output is an address: (region symbol prefix, index of the size argument)
RESULT_REGIONS: dict[str, tuple[str, int]] = {
    "cuMemAddressReserve": ("va", 0),
    "cudaMallocManaged": ("managed", 0),
    "cuMemAlloc": ("dptr", 0),
    "cuMemAllocHost": ("hostalloc", 0),
}

#: calls whose first output is a file descriptor
RESULT_FDS = frozenset({"cuMemExportToShareableHandle"})

#: calls that, when they succeed, end the life of what their first argument names
RETIRES = frozenset(
    {
        "cuMemAddressFree", "cuMemHostUnregister", "cudaHostUnregister", "cudaFree",
        "cuMemFree", "cuMemFreeHost", "cuMemRelease", "cuStreamDestroy", "cudaStreamDestroy",
        "cuEventDestroy", "cudaEventDestroy", "cuDevicePrimaryCtxRelease",
    }
)  # fmt: skip

#: the fields of a struct that say what a call asked for (the bindings add more)
STRUCT_FIELDS: dict[str, tuple[str, ...]] = {
    "CUmemLocation": ("type", "id"),
    "cudaMemLocation": ("type", "id"),
    "CUmemAllocationProp": ("type", "requestedHandleTypes", "location"),
    "CUmemAccessDesc": ("location", "flags"),
    "CUuuid": ("bytes",),
}

#: handle types whose value is meaningful (an ordinal), kept as a value, not a symbol
VALUE_HANDLES = frozenset({"CUdevice"})


class _Symbols:
    """One role's symbol tables (a process's, or a thread's recording another role)."""

    def __init__(self) -> None:
        self.counters: dict[str, int] = {}
        self.handles: dict[tuple[str, int], str] = {}  # (type name, value) -> symbol
        self.regions: list[tuple[int, int, str]] = []  # (base, size, symbol)

    def fresh(self, prefix: str) -> str:
        n = self.counters.get(prefix, 0) + 1
        self.counters[prefix] = n
        return f"${prefix}#{n}"

    def region_of(self, address: int) -> tuple[int, str] | None:
        for base, size, symbol in reversed(self.regions):
            if base <= address < base + max(size, 1):
                return base, symbol
        return None

    def new_region(self, prefix: str, base: int, size: int) -> str:
        symbol = self.fresh(prefix)
        self.regions = [r for r in self.regions if r[0] != base]
        self.regions.append((base, size, symbol))
        return symbol

    def retire_address(self, address: int) -> None:
        self.regions = [r for r in self.regions if r[0] != address]

    def retire_handle(self, key: tuple[str, int]) -> None:
        self.handles.pop(key, None)


def _enum_name(value: Any) -> str | None:
    """`Type.MEMBER` for a bindings enum member (IntEnum in the fake, FastEnum in 13.x)."""
    if type(value) in (int, bool) or not isinstance(value, int):
        return None
    name = getattr(value, "name", None)
    return f"{type(value).__name__}.{name}" if isinstance(name, str) else None


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return int(value)
    if hasattr(value, "__int__") and not isinstance(value, float):
        try:
            return int(value)
        except (TypeError, ValueError):
            return None
    return None


class Normaliser:
    """Turns call arguments and results into JSON values (see the module doc)."""

    def __init__(self, symbols: _Symbols) -> None:
        self.s = symbols

    def address(self, value: Any, prefix: str, size: int | None) -> Any:
        number = _as_int(value)
        if number is None:
            return self.value(value)
        if number == 0:
            text = "NULL"
        else:
            found = self.s.region_of(number)
            if found is None:
                text = self.s.new_region(prefix, number, size or 1)
                found = (number, text)
            base, symbol = found
            text = f"{symbol}+{number - base:#x}"
        if type(value) is int:
            return text
        return f"{type(value).__name__}({text})"

    def fd(self, value: Any) -> Any:
        if type(value) is not int:
            return {"unexpected fd type": type(value).__name__, "value": self.value(value)}
        return self.s.fresh("fd")

    def handle(self, value: Any, number: int, *, produced: bool) -> str:
        kind = type(value).__name__
        if kind in VALUE_HANDLES:
            return f"{kind}({number})"
        if number == 0:
            return f"{kind}(NULL)"
        key = (kind, number)
        symbol = None if produced else self.s.handles.get(key)
        if symbol is None:
            symbol = self.s.fresh(kind)
            self.s.handles[key] = symbol
        return symbol

    def value(self, value: Any, *, produced: bool = False) -> Any:
        if value is None or isinstance(value, bool | float | str):
            return value
        enum = _enum_name(value)
        if enum is not None:
            return enum
        if type(value) is int:
            return value
        if isinstance(value, bytes | bytearray):
            return {"bytes": bytes(value).split(b"\0", 1)[0].decode(errors="replace")}
        if isinstance(value, list | tuple):
            return [self.value(v, produced=produced) for v in value]
        number = _as_int(value)
        if number is not None:
            return self.handle(value, number, produced=produced)
        return self.struct(value, produced=produced)

    def struct(self, value: Any, *, produced: bool) -> dict[str, Any]:
        kind = type(value).__name__
        fields = STRUCT_FIELDS.get(kind)
        if fields is None:
            fields = tuple(
                name
                for name in dir(value)
                if not name.startswith("_") and not callable(getattr(value, name, None))
            )
        out: dict[str, Any] = {"struct": kind}
        for name in fields:
            try:
                field = getattr(value, name)
            except Exception as e:  # a field the bindings cannot read back
                out[name] = {"unreadable": type(e).__name__}
                continue
            if kind == "CUuuid" and name == "bytes":
                out[name] = self.uuid(bytes(field))
            else:
                out[name] = self.value(field, produced=produced)
        return out

    def uuid(self, raw: bytes) -> str:
        key = ("uuid", int.from_bytes(raw, "big"))
        symbol = self.s.handles.get(key)
        if symbol is None:
            symbol = self.s.fresh("uuid")
            self.s.handles[key] = symbol
        return symbol

    # --- one call ---------------------------------------------------------------------

    def args(self, fn: str, args: tuple[Any, ...]) -> list[Any]:
        roles = ARG_ROLES.get(fn, ())
        size = next((_as_int(a) for a, r in zip(args, roles, strict=False) if r == "size"), None)
        out = []
        for i, arg in enumerate(args):
            role = roles[i] if i < len(roles) else None
            if role == "ptr":
                out.append(self.address(arg, "dev", size))
            elif role == "hptr":
                out.append(self.address(arg, "host", size))
            elif role == "fd":
                out.append(self.fd(arg))
            else:
                out.append(self.value(arg))
        return out

    def outputs(self, fn: str, args: tuple[Any, ...], outputs: tuple[Any, ...]) -> list[Any]:
        out: list[Any] = []
        for i, value in enumerate(outputs):
            if i == 0 and fn in RESULT_REGIONS and value is not None:
                prefix, size_index = RESULT_REGIONS[fn]
                number = _as_int(value)
                size = _as_int(args[size_index]) if size_index < len(args) else None
                if number is None:
                    out.append(self.value(value))
                    continue
                symbol = self.s.new_region(prefix, number, size or 1)
                out.append(symbol if type(value) is int else f"{type(value).__name__}({symbol})")
            elif i == 0 and fn in RESULT_FDS and type(value) is int:
                out.append(self.s.fresh("fd"))
            else:
                out.append(self.value(value, produced=True))
        return out

    def retire(self, fn: str, args: tuple[Any, ...]) -> None:
        if fn not in RETIRES or not args:
            return
        target = args[0]
        number = _as_int(target)
        if number is None:
            return
        if type(target) is int or fn in ARG_ROLES:
            self.s.retire_address(number)
        else:
            self.s.retire_handle((type(target).__name__, number))


class Recorder:
    """The process's recording: calls by role, optionally appended to files as they return."""

    def __init__(self, prefix: str | None = None, default_role: str = "main") -> None:
        self.prefix = prefix
        self.default_role = default_role
        self._lock = threading.Lock()
        self._tls = threading.local()
        self._calls: dict[str, list[dict[str, Any]]] = {}
        self._symbols: dict[str, _Symbols] = {}
        self._files: dict[str, Any] = {}
        self._proxies: dict[int, _Module] = {}
        self.meta: dict[str, Any] = {}

    @contextmanager
    def role(self, name: str) -> Iterator[None]:
        """Record this thread's calls under `name` (another process's role) while inside."""
        previous = getattr(self._tls, "role", None)
        self._tls.role = name
        try:
            yield
        finally:
            self._tls.role = previous

    def current_role(self) -> str:
        return getattr(self._tls, "role", None) or self.default_role

    def roles(self) -> list[str]:
        with self._lock:
            return list(self._calls)

    def calls(self, role: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._calls.get(role or self.default_role, []))

    def path(self, role: str) -> str | None:
        return None if self.prefix is None else f"{self.prefix}.{role}.jsonl"

    def wrap(self, driver: Any, runtime: Any | None) -> tuple[Any, Any | None]:
        package = sys.modules.get("cuda.bindings")
        self.meta = {
            "bindings_version": str(getattr(package, "__version__", "")),
            "fake": "_modelswap_fake_cuda" in sys.modules or not hasattr(driver, "__file__"),
            "python": sys.version.split()[0],
        }
        return self._proxy(driver, "driver"), (
            None if runtime is None else self._proxy(runtime, "runtime")
        )

    def _proxy(self, module: Any, api: str) -> Any:
        if isinstance(module, _Module):
            return module
        with self._lock:
            proxy = self._proxies.get(id(module))
            if proxy is None:
                proxy = _Module(module, api, self)
                self._proxies[id(module)] = proxy
            return proxy

    def log(self, api: str, fn: str, args: tuple[Any, ...], result: Any, raised: Any) -> None:
        """Record one returned (or raised) call. Never raises: a recorder fault must not
        change the run it records, so it is written down as the call's `recorder_error`."""
        role = self.current_role()
        with self._lock:
            symbols = self._symbols.setdefault(role, _Symbols())
            n = Normaliser(symbols)
            entry: dict[str, Any] = {"fn": fn, "api": api}
            try:
                entry["args"] = n.args(fn, args)
                if raised is not None:
                    entry["raised"] = f"{type(raised).__name__}: {raised}"
                else:
                    parts = result if isinstance(result, tuple) else (result,)
                    entry["code"] = n.value(parts[0])
                    entry["out"] = n.outputs(fn, args, tuple(parts[1:]))
                    if _as_int(parts[0]) == 0:
                        n.retire(fn, args)
                json.dumps(entry)
            except Exception as e:
                entry = {"fn": fn, "api": api, "recorder_error": f"{type(e).__name__}: {e}"}
            self._calls.setdefault(role, []).append(entry)
            try:
                self._write(role, entry)
            except OSError as e:
                print(f"cuda_recorder: cannot write {self.path(role)}: {e}", file=sys.stderr)

    def _write(self, role: str, entry: dict[str, Any]) -> None:
        path = self.path(role)
        if path is None:
            return
        f = self._files.get(role)
        if f is None:
            f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the process
            self._files[role] = f
            header = {"meta": {**self.meta, "role": role, "pid": os.getpid()}}
            f.write(json.dumps(header) + "\n")
        f.write(json.dumps(entry) + "\n")
        f.flush()


class _Module:
    """A binding module whose `cu*` / `cuda*` functions log through a `Recorder`."""

    def __init__(self, module: Any, api: str, recorder: Recorder) -> None:
        self._module = module
        self._api = api
        self._recorder = recorder
        self._wrapped: dict[str, Callable[..., Any]] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._module, name)
        if not name.startswith("cu") or isinstance(attr, type) or not callable(attr):
            return attr  # enums, structs, handle types, #define constants
        fn = self._wrapped.get(name)
        if fn is None:
            fn = self._wrap(name, attr)
            self._wrapped[name] = fn
        return fn

    def __dir__(self) -> list[str]:
        return dir(self._module)

    def _wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        recorder, api = self._recorder, self._api

        def call(*args: Any) -> Any:
            try:
                result = real(*args)
            except Exception as e:
                recorder.log(api, name, args, None, e)
                raise
            recorder.log(api, name, args, result, None)
            return result

        call.__name__ = name
        return call


_process: dict[str, Recorder] = {}  # "recorder" -> the process's one
_process_lock = threading.Lock()


def recorder() -> Recorder:
    """The process's recorder, made on first use from the environment."""
    with _process_lock:
        found = _process.get("recorder")
        if found is None:
            found = Recorder(os.environ.get(RECORD_ENV) or None, os.environ.get(ROLE_ENV) or "main")
            _process["recorder"] = found
        return found


def reset() -> None:
    """Forget the process's recorder (tests that record more than once in one process)."""
    with _process_lock:
        _process.pop("recorder", None)


def wrap(driver: Any, runtime: Any | None) -> tuple[Any, Any | None]:
    """The `MODELSWAP_CUDA_WRAP` entry point: the modules, wrapped by the process's recorder."""
    return recorder().wrap(driver, runtime)


def read_jsonl(path: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(meta, calls) of one role's file."""
    meta: dict[str, Any] = {}
    calls: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            item = json.loads(line)
            if "meta" in item:
                meta = item["meta"]
            else:
                calls.append(item)
    return meta, calls
