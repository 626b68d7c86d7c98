"""bench.shaping's options and its workload (the run itself: tests/integration/
test_tinyllama_shaping_served.py runs the same workload through a served node)."""

import pytest

from bench import shaping


@pytest.mark.parametrize(
    "argv",
    [["--burst", "1"], ["--repeats", "0"], ["--wait-ms", "0"], ["--wait-ms", "1001"],
     ["--edges", "a,b"]],
)  # fmt: skip
def test_bad_options_are_refused_before_anything_runs(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        shaping.main(argv)
    assert e.value.code == 2


def test_the_workload_interleaves_short_and_long_prompts() -> None:
    texts = shaping.prompts(16)
    lengths = [len(t.encode()) for t in texts]
    assert all(20 <= n <= 60 for n in lengths[0::2]), lengths
    assert all(600 <= n <= 1000 for n in lengths[1::2]), lengths
    assert len(set(texts)) == 16
