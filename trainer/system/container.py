"""Whether this process runs in a container, for advice that is acted on outside it.

The la-trainer image runs as its own user (uid 10001) and leaves matplotlib out: a message that means
changing a folder's owner or installing a package is then acted on where the container is started
(``docker run --user``, the host), not by a command typed where the message appears. Used by the run
record's folder refusal (:func:`trainer.records.runrecord.check_output_folder`) and the report's advice
(:func:`trainer.commands.report.plots_advice`).
"""

from __future__ import annotations

import os

__all__ = ["CONTAINER_MARKERS", "in_container"]

CONTAINER_MARKERS = ("/.dockerenv", "/run/.containerenv")
"""Files a container runtime leaves at the root: Docker's and Podman's."""


def in_container() -> bool:
    """This process runs in a container (one of :data:`CONTAINER_MARKERS` exists)."""
    return any(os.path.exists(marker) for marker in CONTAINER_MARKERS)
