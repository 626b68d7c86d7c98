"""Layout rules that import-linter cannot express: empty package __init__ files, no stdlib
shadowing, and standard-library-only modules checked by walking their imports."""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "modelswap_api": ROOT / "api" / "modelswap_api",
    "modelswap_operator": ROOT / "operator" / "modelswap_operator",
    "modelswap_sidecar": ROOT / "sidecar" / "modelswap_sidecar",
    "modelswap_client": ROOT / "client" / "modelswap_client",
}
# What client code may import lazily, at use, beside the standard library.
#: imported at use only (modelswap_client.torch, size_command, allocation, views)
CLIENT_OPTIONAL = {"numpy", "torch", "cupy", "cuda", "transformers", "safetensors"}


def imports_of(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_package_init_files_are_empty_of_imports() -> None:
    for package_dir in PACKAGES.values():
        for init in package_dir.rglob("__init__.py"):
            assert not imports_of(init), f"{init} imports something"


def test_no_package_is_named_after_a_standard_library_module() -> None:
    for package_dir in PACKAGES.values():
        for init in package_dir.rglob("__init__.py"):
            assert init.parent.name not in sys.stdlib_module_names, init.parent


def test_wire_imports_only_the_standard_library() -> None:
    for name in imports_of(PACKAGES["modelswap_api"] / "wire.py"):
        assert name.split(".")[0] in sys.stdlib_module_names or name == "__future__", name


def test_client_imports_only_the_standard_library_wire_and_optional_accelerators() -> None:
    for path in PACKAGES["modelswap_client"].rglob("*.py"):
        for name in imports_of(path):
            top = name.split(".")[0]
            allowed = (
                top in sys.stdlib_module_names or top in CLIENT_OPTIONAL or top == "__future__"
            )
            assert allowed or name == "modelswap_api.wire" or top == "modelswap_client", (
                f"{path}: {name}"
            )


def test_no_import_circle_among_the_nodes_modules() -> None:
    """No module of the node, the simulator's included, imports, directly or through
    others, one that imports it (type-checking imports counted too). Between packages,
    pyproject.toml's acyclic_siblings contract says the same at every depth."""
    import grimp

    graph = grimp.build_graph("modelswap_sidecar", exclude_type_checking_imports=False)
    circles = sorted(
        {
            tuple(sorted((module, imported)))
            for module in graph.modules
            for imported in graph.find_modules_directly_imported_by(module)
            if imported.startswith("modelswap_sidecar.") and graph.chain_exists(imported, module)
        }
    )
    assert circles == [], circles
