"""Suite-wide settings.

torch uses one intra-op thread in tests: the networks here are tiny, a second thread only adds
contention on the 2-core CI machine, and single-threaded CPU results are the ones our determinism
tests pin.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.torch_use import imports_torch, kept_off_reason

os.environ.setdefault("OMP_NUM_THREADS", "1")

try:
    import torch
except ImportError:  # pragma: no cover - protocol tests run without torch
    torch = None  # type: ignore[assignment]
else:
    torch.set_num_threads(1)

try:
    from hypothesis import settings as _hypothesis_settings
except ImportError:  # pragma: no cover
    pass
else:
    # No per-example deadline: CI machines are shared and timing is not what these tests assert.
    _hypothesis_settings.register_profile("la-trainer", deadline=None)
    _hypothesis_settings.load_profile("la-trainer")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses torch ``torch`` (tests/support/torch_use.py says which), so that the
    engine-torch step (scripts/test_engine_torch.sh) selects them by marker: a new torch test is in that
    step without anyone editing a list. The few kept out for time get ``not_on_engine_torch`` with the
    reason from ``KEPT_OFF_ENGINE_TORCH`` (or carry the mark themselves, with ``reason=``)."""
    del config
    for item in items:
        if item.get_closest_marker("integration") is not None or imports_torch(Path(str(item.path))):
            item.add_marker(pytest.mark.torch)
        reason = kept_off_reason(item.nodeid)
        if reason is not None:
            item.add_marker(pytest.mark.not_on_engine_torch(reason=reason))
        kept_out = item.get_closest_marker("not_on_engine_torch")
        if kept_out is not None and not str(kept_out.kwargs.get("reason", "")).strip():
            # A test missing from the engine-torch step must say why and what covers its torch use there.
            raise pytest.UsageError(f"{item.nodeid}: not_on_engine_torch needs reason=...")
