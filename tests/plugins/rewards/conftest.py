"""Fixtures shared by the reward tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def math_reward() -> Iterator[Any]:
    """The ``math`` reward with one worker and no verdict cache, shared by every test that only scores with it (so
    each score is computed afresh): its worker starts once per test process, on first use, instead of once per
    module or test (math-verify's import is seconds of CPU, more on a loaded machine). Without the parsers'
    warm-up (1.6 CPU-seconds per start): verdicts do not depend on it, and these tests score within the default
    3 s limit, which a cold parse stays far inside. A test that needs other options, a fresh pool or a patched
    reward builds its own."""
    from rstar_plugins.rewards import MathReward

    with MathReward(workers=1, cache_size=0, warm_up=False) as reward:
        yield reward
