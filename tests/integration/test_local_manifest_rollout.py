"""Local mode rolls out an edited spec.model as a cluster does (real Triton, sim GPU).

Editing a served model's `weightsBytes` in its manifest gives the entry a new model
generation (local/desired.py), so the agent loads the changed model as a new instance
beside the old one and serves it; before local mode sent model generations the agent
refused the edit (`conflict ModelChanged`) and the old model served on. The toy model
answers the CRC-32 of its weights region, whose size is `weightsBytes`, so the answer
shows which instance serves.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest

from tests.integration.test_local_dev_loop import TOY, modelswap_up, toy_copy, weights
from tests.support.waiting import wait_for

MIB = 1 << 20

pytestmark = [pytest.mark.slow]


def crc_over(region_bytes: int, data: bytes) -> int:
    """What the toy answers: the CRC-32 of `data` tiled across a region of that size."""
    return zlib.crc32((data * (region_bytes // len(data) + 1))[:region_bytes])


@pytest.mark.timeout(300)
def test_editing_a_manifests_weights_bytes_rolls_the_model_out(tmp_path: Path) -> None:
    models = tmp_path / "models"
    toy_copy(models, "toy", seed=7)
    manifest = TOY.format(name="toy")
    with modelswap_up(tmp_path, {"toy.yaml": manifest}, models) as up:
        first = wait_for(lambda: up.infer("toy"), timeout_seconds=120, what="toy to answer")
        assert first["CHECKSUM"] == crc_over(2 * MIB, weights(7))

        folder = tmp_path / "deployments"
        edited = manifest.replace("weightsBytes: 2Mi", "weightsBytes: 3Mi")
        assert edited != manifest
        tmp = folder / ".toy.yaml.swp"
        tmp.write_text(edited)
        tmp.replace(folder / "toy.yaml")

        after = wait_for(
            lambda: (a := up.infer("toy")) and a["CHECKSUM"] == crc_over(3 * MIB, weights(7)) and a,
            timeout_seconds=120,
            what="toy to answer from a 3 MiB region (the edit rolled out)",
        )
        assert after["RESTORED"] is False  # loaded from its files, not the old host copy
        wait_for(
            lambda: up.model("toy") is not None and up.model("toy")["phase"] == "Resident",
            timeout_seconds=60,
            what="toy to be Resident",
        )
        status = up.status()
        assert "ModelChanged" not in status, status
        assert "ModelChanged" not in up.log()
        outcome = next(m for m in up.local_state()["models"] if m["name"] == "toy")["outcome"]
        assert outcome is not None and "conflict" not in outcome, outcome
