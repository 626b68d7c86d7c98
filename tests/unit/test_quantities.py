import pytest

from modelswap_api.errors import QuantityError
from modelswap_api.quantities import Duration, Quantity, parse_bytes, parse_seconds


@pytest.mark.parametrize(
    ("text", "expected"),
    [(1, 1), ("1", 1), ("4Gi", 4 << 30), ("512Mi", 512 << 20), ("3k", 3000), ("2G", 2 * 10**9)],
)
def test_quantities_parse_to_bytes(text: int | str, expected: int) -> None:
    assert parse_bytes(text) == expected
    assert Quantity(text).bytes == expected


@pytest.mark.parametrize("text", [0, -1, "0", "-1", "500m", "0Gi", "1.5", "1.5Gi", "1e9", "", True])
def test_quantities_refuse_zero_negative_milli_and_fractions(text: object) -> None:
    with pytest.raises(QuantityError):
        parse_bytes(text)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5m", 300.0), ("1h30m", 5400.0), ("500ms", 0.5), ("90s", 90.0), ("never", None)],
)
def test_durations_parse_to_seconds(text: str, seconds: float | None) -> None:
    assert parse_seconds(text) == seconds
    assert Duration(text).is_never is (seconds is None)


@pytest.mark.parametrize("text", ["", "5", "5 minutes", "-5m", "1d", "Never"])
def test_durations_refuse_other_text(text: str) -> None:
    with pytest.raises(QuantityError):
        Duration(text)
