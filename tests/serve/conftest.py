"""Fixtures shared by the server suites."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def openenv_clients() -> None:
    """OpenEnv's clients, for the tests that import them, without its Gradio web UI. Imported by this fixture, not at
    collection: every test process collects each module, one runs it."""
    from rstar_env.serve import import_openenv

    import_openenv()
