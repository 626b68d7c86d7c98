"""`modelswap validate FILE|DIR…`: check ModelDeployment/SwapNode YAML as the cluster would.

Prints one line per problem, `FILE: Kind namespace/name: field.path: message`, and exits
non-zero when any document is invalid, so it fits CI pipelines and pre-commit hooks. Files
are read within the limits of `modelswap_api.yaml_input` (1 MiB, UTF-8, aliases, depth,
no duplicate keys); a file refused by one is one line naming the file and the limit. A
document holding a value JSON cannot hold (an unquoted date, `!!binary`, `!!set`, ...) is
one problem naming its field; the file's other documents are checked. Every line is
written through `terminal.printable`: a name or value holding escape codes shows them
escaped instead of acting on the terminal.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from modelswap_api.resources import validate_resource
from modelswap_api.terminal import printable
from modelswap_api.yaml_input import RefusedDocument, YamlInputError, read_file

YAML_SUFFIXES = (".yaml", ".yml")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="check ModelDeployment YAML exactly as the cluster would",
        description=__doc__,
    )
    parser.add_argument("paths", nargs="+", metavar="FILE|DIR", type=Path)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    return validate_paths(args.paths, sys.stdout)


def validate_paths(paths: list[Path], out: TextIO) -> int:
    """Validate every YAML document under `paths`; 0 when all are valid, 1 otherwise."""
    checked = problems = 0
    for file in _yaml_files(paths):
        for label, messages in _check_file(file):
            checked += 1
            for message in messages:
                problems += 1
                out.write(printable(f"{file}: {label}: {message}") + "\n")
    if checked == 0 and problems == 0:
        out.write("no YAML documents found\n")
        return 1
    status = "valid" if problems == 0 else f"{problems} problem(s)"
    out.write(f"{checked} document(s) checked: {status}\n")
    return 0 if problems == 0 else 1


def _yaml_files(paths: list[Path]) -> Iterator[Path]:
    for path in paths:
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.suffix in YAML_SUFFIXES)
        else:
            yield path


def _check_file(file: Path) -> Iterator[tuple[str, list[str]]]:
    try:
        documents = read_file(file)
    except YamlInputError as e:
        yield "file", [str(e)]
        return
    except OSError as e:
        yield "file", [f"cannot read: {e.strerror or e}"]
        return
    for index, document in enumerate(documents):
        if isinstance(document, RefusedDocument):
            label = (
                _label(document.document, index)
                if isinstance(document.document, dict)
                else f"document {index + 1}"
            )
            yield label, [document.message]
            continue
        if not isinstance(document, dict):
            yield f"document {index + 1}", ["not a Kubernetes object (expected a mapping)"]
            continue
        result = validate_resource(document)
        yield _label(document, index), [str(e) for e in result.errors]


def _label(document: dict[str, Any], index: int) -> str:
    metadata = document.get("metadata") if isinstance(document.get("metadata"), dict) else {}
    assert isinstance(metadata, dict)
    # a refused document's fields may be of any type: only strings name it
    name = _text(metadata.get("name")) or f"(document {index + 1})"
    namespace = _text(metadata.get("namespace"))
    kind = _text(document.get("kind")) or "object"
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None
