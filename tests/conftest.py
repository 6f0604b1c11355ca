"""Suite-wide settings.

torch uses one intra-op thread in tests: the networks here are tiny, a second thread only adds
contention on the 2-core CI machine, and single-threaded CPU results are the ones our determinism
tests pin.
"""

from __future__ import annotations

import os

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
