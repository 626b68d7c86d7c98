"""Regenerate the example models' committed weight files (deterministic; run from anywhere).

    python examples/models/make_weights.py

The files are small (a few KiB); each model tiles its file across the weights region the
agent gives it (32 MiB for `mlp`, 64 MiB for `tinylm`), so every byte of the region is
meaningful and a checksum of the whole region proves none was lost in a swap.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

# Shapes; keep in step with each config.pbtxt's parameters and reference.py.
MLP_SIZES = (16, 64, 8)
TINYLM_VOCAB = 64
TINYLM_DIM = 16


def mlp_weights(seed: int = 7) -> bytes:
    rng = np.random.default_rng(seed)
    n_in, n_hidden, n_out = MLP_SIZES
    parts = [
        rng.standard_normal((n_in, n_hidden)) / np.sqrt(n_in),
        rng.standard_normal(n_hidden) * 0.1,
        rng.standard_normal((n_hidden, n_out)) / np.sqrt(n_hidden),
        rng.standard_normal(n_out) * 0.1,
    ]
    return b"".join(p.astype("<f4").tobytes() for p in parts)


def tinylm_weights(seed: int = 11) -> bytes:
    rng = np.random.default_rng(seed)
    v, d = TINYLM_VOCAB, TINYLM_DIM
    parts = [rng.integers(-8, 9, size=shape) for shape in ((v, d), (d, d), (d, d), (d, d), (d, v))]
    return b"".join(p.astype("<i4").tobytes() for p in parts)


def main() -> None:
    (HERE / "mlp" / "1" / "weights.f32").write_bytes(mlp_weights())
    (HERE / "tinylm" / "1" / "weights.i32").write_bytes(tinylm_weights())


if __name__ == "__main__":
    main()
