"""Pure: the ModelDeployment YAML files of a local-mode folder, checked as the cluster
checks them (`validate_resource`, then `effective_policy` over the local defaults).

    models, problems = read_folder(folder, defaults)

Every file directly in the folder ending in `.yaml`/`.yml` is read (sub-folders are not:
`models/` beside them holds the model sources). A document that fails is a `Problem`
naming its file and field, and is skipped; the others are served (a document holding a
value JSON cannot hold, such as an unquoted date, is one of them). UIDs are stable
(`local_uid`: a UUID5 of namespace/name), so an edited file keeps its model.

At most `MAX_LOCAL_MODELS` models are served (4,096: the most entries the agent's control
API takes in one desired set). `cap_models` takes the files in name order while their
models fit; the first file whose models would pass the cap, and every file after it, are
refused by name (one problem each), and the files before it are served.

A document annotated `modelswap.io/dev: "true"` declares a dev model (the dev loop, docs/
LOCAL.md): a developer's own process serves it, outside Triton. Without the dev loop
(`modelswap up` without `--dev`) such a document is a problem naming the annotation.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelswap_api.control import MAX_ENTRIES
from modelswap_api.errors import PolicyError
from modelswap_api.policy import EffectivePolicy, effective_policy
from modelswap_api.resources import validate_resource
from modelswap_api.yaml_input import RefusedDocument, YamlInputError
from modelswap_api.yaml_input import read_file as read_yaml_file

log = logging.getLogger(__name__)

YAML_SUFFIXES = (".yaml", ".yml")
MODEL_DEPLOYMENT = "ModelDeployment"
DEFAULT_NAMESPACE = "default"
#: The annotation that declares a dev model ("true"; "false" or absent: a Triton model).
DEV_ANNOTATION = "modelswap.io/dev"
#: Most models local mode serves: the agent takes at most this many desired entries.
MAX_LOCAL_MODELS = MAX_ENTRIES
_UID_NAMESPACE = uuid.UUID("6b1c5d2e-9a0f-4f4e-8e43-6d6f64656c73")


def local_uid(namespace: str, name: str) -> str:
    """The UID local mode gives namespace/name: the same on every run and every edit."""
    return str(uuid.uuid5(_UID_NAMESPACE, f"{namespace}/{name}"))


@dataclass(frozen=True)
class LocalModel:
    file: Path
    namespace: str
    name: str
    uid: str
    #: The validated spec (wire form, as the API server would store it).
    spec: Mapping[str, Any]
    policy: EffectivePolicy
    #: A dev model (`modelswap.io/dev: "true"`): served by a developer's own process.
    dev: bool = False


@dataclass(frozen=True)
class Problem:
    file: Path
    #: `ModelDeployment default/chat`, or `document 2` when it has no name.
    label: str
    #: `spec.swapPolicy.idleAfter: ...` — the field first.
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.label}: {self.message}"


def yaml_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in YAML_SUFFIXES)


def _label(document: Mapping[str, Any], index: int) -> str:
    metadata = document.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    namespace = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    if not isinstance(namespace, str):
        namespace = None
    kind = document.get("kind") if isinstance(document.get("kind"), str) else None
    kind = kind or "object"
    if not name or not isinstance(name, str):  # a refused document's name may be a date
        return f"document {index + 1}"
    return f"{kind} {namespace or DEFAULT_NAMESPACE}/{name}"


def _dev_of(metadata: Mapping[str, Any], *, dev_loop: bool) -> bool | str:
    """Whether the object declares a dev model, or the problem with its annotation."""
    annotations = metadata.get("annotations") or {}
    value = annotations.get(DEV_ANNOTATION)
    field = f"metadata.annotations[{DEV_ANNOTATION}]"
    if value is None or value == "false":
        return False
    if value != "true":
        return f'{field}: Unsupported value: {str(value)[:40]!r}: "true" or "false"'
    if not dev_loop:
        return (
            f"{field}: a dev model is served by your own process, which local mode vouches "
            "for only with `modelswap up --dev`"
        )
    return True


def check_document(
    file: Path,
    document: Any,
    index: int,
    defaults: Mapping[str, Any],
    *,
    dev_loop: bool = False,
) -> LocalModel | list[Problem]:
    """One YAML document: a model to serve, or its problems (each naming its field).
    `dev_loop`: dev models are allowed (`modelswap up --dev`)."""
    if not isinstance(document, Mapping):
        return [Problem(file, f"document {index + 1}", "not a Kubernetes object (a mapping)")]
    label = _label(document, index)
    if document.get("kind") != MODEL_DEPLOYMENT:
        kind = document.get("kind")
        return [Problem(file, label, f"kind: local mode serves ModelDeployments, not {kind!r}")]
    result = validate_resource(document)
    if result.errors:
        return [Problem(file, label, str(error)) for error in result.errors]
    obj = result.object
    spec = obj["spec"]
    try:
        policy = effective_policy(spec, defaults)
    except PolicyError as e:
        return [Problem(file, label, str(error)) for error in e.errors]
    metadata = obj["metadata"]
    dev = _dev_of(metadata, dev_loop=dev_loop)
    if isinstance(dev, str):
        return [Problem(file, label, dev)]
    namespace = str(metadata.get("namespace") or DEFAULT_NAMESPACE)
    name = str(metadata["name"])
    return LocalModel(file, namespace, name, local_uid(namespace, name), spec, policy, dev)


def read_file(
    file: Path, defaults: Mapping[str, Any], *, dev_loop: bool = False
) -> tuple[list[LocalModel], list[Problem]]:
    """The file's models and problems; a file refused by a limit of
    `modelswap_api.yaml_input` (size, UTF-8, aliases, depth, duplicate keys) is one problem
    naming it, and the folder's other files are served. A document holding a value JSON
    cannot hold is a problem naming its field; the file's other documents are served."""
    try:
        documents = read_yaml_file(file)
    except YamlInputError as e:
        return [], [Problem(file, "file", str(e))]
    except OSError as e:
        return [], [Problem(file, "file", f"cannot read: {e.strerror or e}")]
    models: list[LocalModel] = []
    problems: list[Problem] = []
    for index, document in enumerate(documents):
        if document is None:
            continue
        if isinstance(document, RefusedDocument):
            label = (
                _label(document.document, index)
                if isinstance(document.document, Mapping)
                else f"document {index + 1}"
            )
            problems.append(Problem(file, label, document.message))
            continue
        try:
            checked = check_document(file, document, index, defaults, dev_loop=dev_loop)
        except Exception:  # a bug in checking one document must not stop the folder's others
            log.exception("local mode: checking document %d of %s failed", index + 1, file)
            checked = [
                Problem(file, f"document {index + 1}", "cannot be checked (an internal error)")
            ]
        if isinstance(checked, LocalModel):
            models.append(checked)
        else:
            problems.extend(checked)
    return models, problems


def read_folder(
    folder: Path,
    defaults: Mapping[str, Any],
    *,
    dev_loop: bool = False,
    max_models: int | None = MAX_LOCAL_MODELS,
) -> tuple[list[LocalModel], list[Problem]]:
    """Every valid model of `folder`'s YAML files, and the problems of the rest. A second
    document for the same namespace/name is a problem (the first one wins). `max_models`:
    `cap_models` applied (None: not; the watcher caps once it has added the models it
    keeps)."""
    models: list[LocalModel] = []
    problems: list[Problem] = []
    seen: dict[str, Path] = {}
    for file in yaml_files(folder):
        found, bad = read_file(file, defaults, dev_loop=dev_loop)
        problems.extend(bad)
        for model in found:
            first = seen.get(model.uid)
            if first is not None:
                problems.append(
                    Problem(
                        file,
                        f"{MODEL_DEPLOYMENT} {model.namespace}/{model.name}",
                        f"metadata.name: also defined in {first}; this one is skipped",
                    )
                )
                continue
            seen[model.uid] = file
            models.append(model)
    if max_models is None:
        return models, problems
    models, over = cap_models(models, max_models)
    return models, [*problems, *over]


def cap_models(
    models: Sequence[LocalModel], max_models: int = MAX_LOCAL_MODELS
) -> tuple[list[LocalModel], list[Problem]]:
    """At most `max_models` models, whole files at a time: the files in name order while
    their models fit; the first file whose models would pass the cap and every file after it
    are refused, one problem naming each (a push over the agent's limit would be refused
    whole, and every model with it)."""
    by_file: dict[Path, list[LocalModel]] = {}
    for model in models:
        by_file.setdefault(model.file, []).append(model)
    served: list[LocalModel] = []
    problems: list[Problem] = []
    full = False
    for file in sorted(by_file, key=lambda f: (f.name, str(f))):
        found = by_file[file]
        full = full or len(served) + len(found) > max_models
        if not full:
            served.extend(found)
            continue
        problems.append(
            Problem(
                file,
                "file",
                f"{len(found)} model(s) not served: local mode serves at most {max_models} "
                f"models (MAX_LOCAL_MODELS), taking files in name order; {len(served)} are "
                "served from the files before this one",
            )
        )
    return served, problems
