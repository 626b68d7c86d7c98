"""The agent's `policy` section: what the policy module is given, and bad values refused
naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from modelswap_sidecar.agent.assembly import policy_settings
from modelswap_sidecar.agent.errors import SettingsError
from modelswap_sidecar.agent.settings.document import settings_from_document
from tests.support.agent_documents import settings_document


def document(policy: dict[str, Any]) -> dict[str, Any]:
    return settings_document(policy=policy)


def test_the_policy_gets_the_watermarks_and_the_busy_victim_wait() -> None:
    settings = settings_from_document(
        document({"highWatermarkFraction": 0.9, "lowWatermarkFraction": 0.8,
                  "busyVictimWaitSeconds": 2.5})
    )  # fmt: skip
    given = policy_settings(settings.policy)
    assert (given.high_watermark_fraction, given.low_watermark_fraction) == (0.9, 0.8)
    assert given.busy_victim_wait_seconds == 2.5
    # unset: 10 s; 0: never wait for a busy model to become idle
    assert (
        policy_settings(settings_from_document(document({})).policy).busy_victim_wait_seconds == 10
    )
    zero = settings_from_document(document({"busyVictimWaitSeconds": 0}))
    assert policy_settings(zero.policy).busy_victim_wait_seconds == 0


@pytest.mark.parametrize(
    ("value", "says"),
    [(-1, "must be 0 or more"), ("soon", "not a number"), ("nan", "must be 0 or more")],
)
def test_a_bad_busy_victim_wait_is_refused_naming_it(value: Any, says: str) -> None:
    with pytest.raises(SettingsError, match=f"policy.busyVictimWaitSeconds: {says}"):
        settings_from_document(document({"busyVictimWaitSeconds": value}))
