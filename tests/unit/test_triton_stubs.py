"""Vouching for python-backend stubs from /proc (a fake /proc tree: pids, parents, argv)."""

from __future__ import annotations

from pathlib import Path

from modelswap_sidecar.triton.stubs import (
    TritonVoucher,
    descendant_stub_pids,
    is_descendant,
    stub_names_model,
)

MODEL = "m-0b6f3c1e5a4d4e0f9c2b7d8e9f0a1b2c"
OTHER = "m-ffffffffffffffffffffffffffffffff"
STUB = "/opt/triton/backends/python/triton_python_backend_stub"


def stub_argv(model: str) -> list[str]:
    return [STUB, f"/repo/{model}/1/model.py", "triton_python_backend_shm_region_x", "1048576",
            "1048576", "100", "/opt/triton/backends/python", "336", f"{model}_0_0", "DEFAULT"]  # fmt: skip


def fake_proc(tmp_path: Path, processes: dict[int, tuple[int, list[str]]]) -> Path:
    """`processes`: pid → (parent pid, argv)."""
    proc = tmp_path / "proc"
    for pid, (ppid, argv) in processes.items():
        d = proc / str(pid)
        d.mkdir(parents=True)
        name = Path(argv[0]).name[:15] if argv else "kworker"
        (d / "stat").write_text(f"{pid} ({name} (x)) S {ppid} {pid} {pid} 0 -1 4194304\n")
        (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (proc / "self").mkdir()
    return proc


def test_only_stubs_under_this_triton_naming_this_model_are_vouched_for(tmp_path: Path) -> None:
    proc = fake_proc(
        tmp_path,
        {
            1: (0, ["/sbin/init"]),
            100: (1, ["/venv/tritonserver/bin/tritonserver"]),
            101: (100, stub_argv(MODEL)),
            102: (100, stub_argv(OTHER)),
            103: (101, ["/usr/bin/python3", f"/repo/{MODEL}/1/model.py"]),  # not a stub
            200: (1, ["/other/tritonserver"]),
            201: (200, stub_argv(MODEL)),  # another Triton's stub of a same-named model
        },
    )
    assert descendant_stub_pids(100, MODEL, proc=proc) == [101]
    assert descendant_stub_pids(100, OTHER, proc=proc) == [102]
    voucher = TritonVoucher(lambda: 100, proc=proc)
    assert voucher.vouch(101, MODEL)
    assert not voucher.vouch(101, OTHER)
    assert not voucher.vouch(103, MODEL)
    assert not voucher.vouch(201, MODEL)
    assert not voucher.vouch(999, MODEL)  # gone
    assert not TritonVoucher(lambda: None, proc=proc).vouch(101, MODEL)


def test_the_voucher_maps_the_registered_name_to_the_triton_name(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, {100: (1, ["tritonserver"]), 101: (100, stub_argv(MODEL))})
    names = {"uid-a": MODEL}
    voucher = TritonVoucher(lambda: 100, names.get, proc=proc)
    assert voucher.vouch(101, "uid-a")
    assert not voucher.vouch(101, "uid-b")


def test_descendants_are_found_through_intermediate_processes(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, {100: (1, ["t"]), 150: (100, ["sh"]), 151: (150, stub_argv(MODEL))})
    assert is_descendant(151, 100, proc=proc)
    assert not is_descendant(100, 151, proc=proc)
    assert descendant_stub_pids(100, MODEL, proc=proc) == [151]


def test_the_model_must_be_a_directory_followed_by_a_version() -> None:
    assert stub_names_model(stub_argv(MODEL), MODEL)
    assert not stub_names_model([STUB, f"/repo/x/1/{MODEL}.py"], MODEL)
    assert not stub_names_model([STUB, f"/repo/{MODEL}/latest/model.py"], MODEL)
    assert not stub_names_model(["/bin/python", f"/repo/{MODEL}/1/model.py"], MODEL)
    assert not stub_names_model([], MODEL)
