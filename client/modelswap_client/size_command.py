"""`modelswap size DIR`: the `weightsBytes` a Hugging Face model needs in its region.

DIR is a Hugging Face folder (it has `config.json`) or a folder that holds one, such as a
Triton model folder. The model is built from its config with its parameters on the meta
device (nothing is allocated or read but the config) and laid out as
`modelswap_client.torch` lays it out in a region: every parameter and buffer, each aligned
to 256 bytes, tied weights once. Needs torch and transformers.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TextIO

MIB = 1 << 20


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "size",
        help="the weightsBytes a Hugging Face model folder needs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("path", metavar="DIR", type=Path)
    parser.add_argument(
        "--class",
        dest="cls",
        default=None,
        help="the transformers class the model.py builds (default: the config's "
        "`architectures[0]`, else AutoModel)",
    )
    parser.add_argument("--dtype", default=None, help="the dtype the model is loaded in")
    parser.set_defaults(handler=run)


def find_config(path: Path) -> Path:
    """The folder of the `config.json` at `path` or the shallowest one below it."""
    if (path / "config.json").is_file():
        return path
    found = sorted(path.rglob("config.json"), key=lambda p: (len(p.parts), str(p)))
    if not found:
        raise FileNotFoundError(f"{path}: no config.json in or below it")
    return found[0].parent


def run(args: argparse.Namespace) -> int:
    try:
        return report(args.path, args.cls, args.dtype, sys.stdout)
    except (FileNotFoundError, ValueError, ImportError) as e:
        print(f"modelswap size: {e}", file=sys.stderr)
        return 2


def report(path: Path, cls_name: str | None, dtype: str | None, out: TextIO) -> int:
    import transformers  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415

    from modelswap_client import torch as mstorch  # noqa: PLC0415

    folder = find_config(path)
    if cls_name is None:
        config = transformers.AutoConfig.from_pretrained(str(folder))
        architectures = getattr(config, "architectures", None) or ["AutoModel"]
        cls_name = str(architectures[0])
    cls = getattr(transformers, cls_name, None)
    if cls is None:
        raise ValueError(f"transformers has no class {cls_name!r} (--class)")
    kwargs = {} if dtype is None else {"dtype": dtype}
    with mstorch.empty_parameters():
        model = mstorch.build_pretrained(cls, folder, **kwargs)
    layout = mstorch.layout_of(model)
    parameters = sum(s.size_bytes for s in layout.slots if s.is_parameter)
    buffers = sum(s.size_bytes for s in layout.slots if not s.is_parameter)
    mib = -(-layout.total_bytes // MIB)
    print(f"{folder}: {type(model).__name__}, {len(layout.slots)} tensors", file=out)
    print(f"  parameters {parameters:,} bytes, buffers {buffers:,} bytes", file=out)
    print(f"  required   {layout.total_bytes:,} bytes (aligned, tied weights once)", file=out)
    print(f"spec.model.weightsBytes: {mib}Mi", file=out)
    return 0
