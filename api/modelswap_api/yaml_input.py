"""Reading resource YAML from outside (`modelswap validate`, local mode's folder): bounded
before any expensive work, so one hostile file is refused in well under a second.

Every reader of ModelDeployment YAML goes through `load_file` (or `load_text`), which
refuses, naming the limit:

- a file over `MAX_YAML_FILE_BYTES` (1 MiB; a ModelDeployment is a few KiB, and the API
  server refuses larger objects anyway), checked before it is read;
- text that is not UTF-8 (the offset of the first bad byte is named);
- more than `MAX_YAML_NODES` nodes in one file (20,000: reading is linear in them, about
  20 µs each, and a ModelDeployment has a few hundred), counted on the parser's events
  before anything is composed, the message naming the field being read;
- more than `MAX_YAML_ALIASES` aliases in one file, and aliases that would add more than
  `MAX_YAML_ALIAS_EXPANSION_NODES` nodes to a document once expanded (a "billion laughs"
  file of 652 bytes expands to billions). Aliases are taken, not refused outright, because
  `kubectl apply` takes them (sigs.k8s.io/yaml expands them) and a file that works with
  kubectl should validate here; legitimate sharing adds a few dozen nodes;
- nesting deeper than `MAX_YAML_DEPTH` (64; the deepest ModelDeployment field is 6 levels);
- a key given twice in one mapping (kubectl refuses it too; PyYAML would keep the last one
  silently), naming the key and its line. Merge keys (`<<: *base`) overriding a merged
  key are not duplicates;
- a scalar its explicit tag's constructor cannot read (`!!timestamp 2024-13-45`,
  `!!float x`) or an integer longer than Python reads (`sys.get_int_max_str_digits()`,
  4,300 digits), naming its line;
- a document holding a value JSON cannot hold, naming its field (`json_problem`): a date
  or timestamp (`name: 2024-01-01`: quote it), `!!binary` bytes, a `!!set`, an `!!omap` or
  `!!pairs`, `.nan` or `.inf`, an integer of more than 4,300 digits (a hex literal), or a
  mapping key that is not a string (`1:`, `yes:`, `2024-01-01:`). The API server holds
  JSON, so such a document could never be applied.
  `read_text`/`read_file` refuse just that document (a `RefusedDocument`) and return the
  file's others; `load_text`/`load_file` refuse the file, naming the document.

The sizes of the fields themselves (`maxProperties`, `maxItems`, `maxLength`) are checked
by the validator's pre-check (`validation.bounds_errors`) before jsonschema and CEL run,
and `metadata.annotations` by `resources` (256 KiB in all, as the API server).
"""

from __future__ import annotations

import datetime
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from modelswap_api.field_errors import join_path

#: Largest YAML file read, in bytes.
MAX_YAML_FILE_BYTES = 1 << 20
#: Most nodes (scalars, aliases, collections) in one file: reading is linear in them, and a
#: ModelDeployment has a few hundred at most (split bigger sets across files).
MAX_YAML_NODES = 20_000
#: Most aliases (`*name`) in one file.
MAX_YAML_ALIASES = 64
#: Most nodes that aliases may add to one document when expanded.
MAX_YAML_ALIAS_EXPANSION_NODES = 10_000
#: Deepest nesting of collections.
MAX_YAML_DEPTH = 64

_MERGE_TAG = "tag:yaml.org,2002:merge"
#: LibYAML's parser when PyYAML has it (about ten times faster), else PyYAML's own.
_SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class YamlInputError(ValueError):
    """A YAML input refused: the message names the limit or the problem, and the line."""


class _Loader(_SafeLoader):  # type: ignore[valid-type,misc]
    """Safe loading that refuses a key given twice in one mapping (merge keys aside)."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG or not isinstance(key_node, ScalarNode):
                    continue
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise YamlInputError(
                        f"line {key_node.start_mark.line + 1}: duplicate key {key!r}"
                    )
                seen.add(key)
        result: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return result

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        """PyYAML's, with a scalar its tag's constructor cannot read (`!!timestamp
        2024-13-45`, `!!float x`, `!!bool x`, an int longer than Python reads) refused naming
        its line: those constructors raise ValueError, KeyError or AttributeError, which are
        no YAMLError and would escape as a traceback."""
        try:
            return super().construct_object(node, deep=deep)
        except (YamlInputError, yaml.YAMLError):
            raise
        except (ValueError, KeyError, AttributeError, TypeError, OverflowError) as e:
            raise YamlInputError(_unreadable(node)) from e


def _unreadable(node: Node) -> str:
    line = node.start_mark.line + 1
    tag = str(node.tag).removeprefix("tag:yaml.org,2002:")
    text = str(node.value) if isinstance(node, ScalarNode) else ""
    if tag == "int" and sum(c.isdigit() for c in text) > sys.get_int_max_str_digits() > 0:
        return f"line {line}: an integer longer than {sys.get_int_max_str_digits()} digits"
    shown = repr(text[:40]) + ("..." if len(text) > 40 else "")
    return f"line {line}: {shown} cannot be read as !!{tag}"


#: Python writes integers of at most this many decimal digits (`sys.set_int_max_str_digits`).
_INT_DIGITS = sys.get_int_max_str_digits() or 4300
_TOO_MANY_DIGITS = 10**_INT_DIGITS


@dataclass(frozen=True)
class RefusedDocument:
    """A document refused for a value JSON cannot hold (`json_problem`); the file's other
    documents are read."""

    #: As PyYAML constructed it (for its label: its name may be readable).
    document: Any
    #: `metadata.name: 2024-01-01 is read as a date ...`: the field first.
    message: str


def _what_is_not_json(value: Any) -> str | None:
    """What `value` is when JSON cannot hold it (as the start of a message), else None."""
    if isinstance(value, datetime.datetime):
        return f"{value.isoformat()} is read as a timestamp, which JSON cannot hold; quote it"
    if isinstance(value, datetime.date):
        return f"{value.isoformat()} is read as a date, which JSON cannot hold; quote it"
    if isinstance(value, bytes):
        return "!!binary bytes, which JSON cannot hold; give the base64 text as a string"
    if isinstance(value, (set, frozenset)):
        return "a !!set, which JSON cannot hold; give a list"
    if isinstance(value, tuple):
        return "an !!omap or !!pairs entry, which JSON cannot hold; give a mapping"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a number JSON can hold"
    if isinstance(value, int) and abs(value) >= _TOO_MANY_DIGITS:
        # hex, octal and binary literals are read without int()'s digit limit, but such a
        # number cannot be written in decimal (str() raises), so no message could show it
        return f"an integer of more than {_INT_DIGITS} digits"
    if isinstance(value, (dict, list, str, int, float)) or value is None:
        return None  # bool is an int
    return f"a {type(value).__name__}, which JSON cannot hold"


def _kind_of(key: Any) -> str:
    if isinstance(key, bool):
        return "a boolean"
    if isinstance(key, int):
        return "an integer"
    if isinstance(key, float):
        return "a number"
    if isinstance(key, datetime.datetime):
        return "a timestamp"
    if isinstance(key, datetime.date):
        return "a date"
    if key is None:
        return "null"
    return f"a {type(key).__name__}"


def _key_text(key: Any) -> str:
    if isinstance(key, (datetime.date, bool, float)) or key is None:
        return str(key)
    if isinstance(key, int):
        return str(key) if abs(key) < 10**40 else "(a long integer)"
    return f"({type(key).__name__})"


def json_problem(document: Any) -> str | None:
    """The first value in `document` that JSON cannot hold, as `field.path: what it is;
    what to write instead`; None when all of it is JSON. Walked without recursion (aliases
    may share a collection: each is looked at once)."""
    seen: set[int] = set()
    stack: list[tuple[str, Any]] = [("", document)]
    while stack:
        path, value = stack.pop()
        what = _what_is_not_json(value)
        if what is not None:
            return f"{path or '(document)'}: {what}"
        if not isinstance(value, (dict, list)) or id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, list):
            stack.extend((join_path(path, i), v) for i, v in reversed(list(enumerate(value))))
            continue
        children = []
        for key, child in value.items():
            if not isinstance(key, str):
                text = _key_text(key)
                return (
                    f"{path or '(document)'}: the key {text} is read as {_kind_of(key)}, not a "
                    "string, which a JSON object's keys must be; quote it"
                )
            children.append((join_path(path, key), child))
        stack.extend(reversed(children))
    return None


class _Frame:
    """A collection being read in `_check_events`: its path and where it stands."""

    __slots__ = ("expect_key", "items", "key", "mapping", "path")

    def __init__(self, path: str, mapping: bool) -> None:
        self.path, self.mapping = path, mapping
        self.expect_key, self.key, self.items = True, "", 0

    def child_path(self) -> str:
        if self.mapping:
            return f"{self.path}.{self.key}" if self.path else self.key
        return f"{self.path}[{self.items}]"

    def took_one(self) -> None:
        """A scalar, alias or whole collection was read in this collection."""
        if self.mapping and self.expect_key:
            self.expect_key = False
            return
        self.expect_key = True
        self.items += 1


def _check_events(text: str) -> None:
    """One pass over the parser's events, before anything is composed: node, alias and
    depth limits, the message naming where the limit was reached."""
    loader = _SafeLoader(text)
    frames: list[_Frame] = []
    nodes = aliases = 0
    try:
        while loader.check_event():
            event = loader.get_event()  # type: ignore[no-untyped-call]
            line = event.start_mark.line + 1
            where = f"line {line}" + (f" ({frames[-1].child_path()})" if frames else "")
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                if len(frames) >= MAX_YAML_DEPTH:
                    raise YamlInputError(
                        f"line {line}: nested deeper than {MAX_YAML_DEPTH} levels (MAX_YAML_DEPTH)"
                    )
                path = frames[-1].child_path() if frames else ""
                frames.append(_Frame(path, isinstance(event, yaml.MappingStartEvent)))
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                frames.pop()
                if frames:
                    frames[-1].took_one()
                continue
            elif isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent)):
                if isinstance(event, yaml.AliasEvent):
                    aliases += 1
                    if aliases > MAX_YAML_ALIASES:
                        raise YamlInputError(
                            f"{where}: more than {MAX_YAML_ALIASES} aliases in one file "
                            "(MAX_YAML_ALIASES)"
                        )
                if frames:
                    frame = frames[-1]
                    if frame.mapping and frame.expect_key:
                        frame.key = str(getattr(event, "value", "*"))
                    frame.took_one()
            else:
                continue
            nodes += 1
            if nodes > MAX_YAML_NODES:
                raise YamlInputError(
                    f"{where}: more than {MAX_YAML_NODES} nodes in one file (MAX_YAML_NODES)"
                )
    except yaml.YAMLError as e:
        raise _refusal(e) from e
    finally:
        loader.dispose()


def _refusal(e: yaml.YAMLError) -> YamlInputError:
    """The refusal of a file PyYAML could not read, naming the problem and its line."""
    if "exceeded maximum nesting depth" in str(e):
        # LibYAML from PyYAML 6.0.4 on refuses flow nesting past 1,000 while scanning ahead,
        # before the parser hands over the 65th level: the same refusal as ours.
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        return YamlInputError(
            f"line {line}: nested deeper than {MAX_YAML_DEPTH} levels (MAX_YAML_DEPTH)"
        )
    return YamlInputError(f"cannot read YAML: {_one_line(e)}")


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _check_expansion(root: Node) -> None:
    """Refuse a document whose aliases, expanded, add more than the limit (or refer to
    themselves). Counted without recursion and without expanding: each distinct node's
    expanded size is computed once (sizes are Python ints: a huge one costs nothing)."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            sizes[key] = 1 + sum(sizes[id(c)] for c in _children(node))
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise YamlInputError(f"line {node.start_mark.line + 1}: an alias refers to itself")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in sizes)
    added = sizes[id(root)] - len(sizes)  # expanded nodes less the distinct ones
    if added > MAX_YAML_ALIAS_EXPANSION_NODES:
        raise YamlInputError(
            f"line {root.start_mark.line + 1}: aliases expand this document by more than "
            f"{MAX_YAML_ALIAS_EXPANSION_NODES} nodes (MAX_YAML_ALIAS_EXPANSION_NODES)"
        )


def read_text(text: str) -> list[Any]:
    """The documents of `text` (empty ones dropped), each a value or, when it holds a value
    JSON cannot, a `RefusedDocument` naming the field; YamlInputError when the file itself
    is refused (a limit above, or YAML PyYAML cannot read)."""
    _check_events(text)
    loader = _Loader(text)
    try:
        documents: list[Any] = []
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            _check_expansion(node)
            document = loader.construct_document(node)
            if document is None:
                continue
            problem = json_problem(document)
            documents.append(document if problem is None else RefusedDocument(document, problem))
        return documents
    except YamlInputError:
        raise
    except yaml.YAMLError as e:
        raise _refusal(e) from e
    finally:
        loader.dispose()


def load_text(text: str) -> list[Any]:
    """The documents of `text` (empty ones dropped); YamlInputError naming the problem (a
    document holding a value JSON cannot refuses the file, naming the document and field)."""
    documents = read_text(text)
    for index, document in enumerate(documents):
        if isinstance(document, RefusedDocument):
            raise YamlInputError(f"document {index + 1}: {document.message}")
    return documents


def _read_text(path: Path) -> str:
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_YAML_FILE_BYTES:
            raise YamlInputError(
                f"{size} bytes: larger than the {MAX_YAML_FILE_BYTES}-byte limit "
                "(MAX_YAML_FILE_BYTES)"
            )
        data = f.read(MAX_YAML_FILE_BYTES + 1)  # it may have grown since
    if len(data) > MAX_YAML_FILE_BYTES:
        raise YamlInputError(
            f"larger than the {MAX_YAML_FILE_BYTES}-byte limit (MAX_YAML_FILE_BYTES)"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise YamlInputError(f"not UTF-8 text (byte {e.start} is not valid UTF-8)") from e


def read_file(path: Path) -> list[Any]:
    """`read_text` of the file at `path` (a document holding a value JSON cannot is a
    `RefusedDocument`); YamlInputError (or OSError) when the file itself is refused."""
    return read_text(_read_text(path))


def load_file(path: Path) -> list[Any]:
    """The documents of the file at `path`, within the limits above; YamlInputError (or
    OSError) naming the problem, never a traceback's worth of text."""
    return load_text(_read_text(path))


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())
