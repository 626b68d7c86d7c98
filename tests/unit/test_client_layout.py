"""The client library's shape: no import circle among its modules (type-checking imports
counted too). Its layers are an import-linter contract in pyproject.toml."""

from __future__ import annotations


def test_no_import_circle_among_the_clients_modules() -> None:
    import grimp

    graph = grimp.build_graph("modelswap_client", exclude_type_checking_imports=False)
    circles = sorted(
        {
            tuple(sorted((module, imported)))
            for module in graph.modules
            for imported in graph.find_modules_directly_imported_by(module)
            if imported.startswith("modelswap_client.") and graph.chain_exists(imported, module)
        }
    )
    assert circles == [], circles
