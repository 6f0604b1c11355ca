"""The density of the training time ``t`` as an option value: its text grammar, parsed once.

``--time-distribution`` (``LA_TRAINER_TIME_DISTRIBUTION``, ``"time_distribution"`` in la-trainer.json) is
read into a :class:`TimeDensity` where the options are read (:mod:`trainer.settings.options`), and the
training draws its times from that value (:class:`trainer.training.flow.TimeDistribution`). One grammar,
one check: torch-free, so a bad value is refused before anything else starts.

Grammar: ``uniform``, ``beta:A,B`` (A, B > 0), ``logit_normal`` or ``logit_normal:LOC,SCALE`` (SCALE > 0;
default 0, 1), ``power:K`` (K > 0); surrounding spaces are ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Self, TypeAlias

__all__ = ["TIME_KINDS", "TimeDensity", "TimeKind"]

TimeKind: TypeAlias = Literal["uniform", "beta", "logit_normal", "power"]
TIME_KINDS: tuple[TimeKind, ...] = ("uniform", "beta", "logit_normal", "power")
_PARAMETERS: dict[str, int] = {"uniform": 0, "beta": 2, "logit_normal": 2, "power": 1}
"""How many numbers each kind takes after its colon (``logit_normal`` may also take none)."""


@dataclass(frozen=True, slots=True)
class TimeDensity:
    """The density of ``t ∈ [0, 1]`` (0 = noise, 1 = data). ``kind`` and the meaning of ``a``/``b``:

    * ``"uniform"``: U[0, 1) (``a``, ``b`` unused). This class's default; the trainer's default is
      logit-normal(0, 1), chosen by the quality benchmark (:attr:`trainer.settings.options.TrainerOptions.
      time_distribution`).
    * ``"beta"``: Beta(a, b); mean a/(a + b). ``a > b`` skews toward data.
    * ``"logit_normal"``: sigmoid(a + b·N(0, 1)) (location ``a``, scale ``b > 0``); concentrates on
      mid times as in SD3; ``a > 0`` skews toward data.
    * ``"power"``: U^a with exponent ``a > 0``; mean 1/(1 + a). ``a > 1`` skews toward noise
      (t near 0, where the coarse first Euler steps happen), ``a < 1`` toward data.

    Use the constructors (:meth:`uniform`, :meth:`beta`, :meth:`logit_normal`, :meth:`power`) or
    :meth:`parse` (``"beta:1.5,1"``) rather than positional ``a``/``b``. ``str()`` is the text it was
    parsed from (what the run record and the trackers show), else a spelling :meth:`parse` reads back.
    """

    kind: TimeKind = "uniform"
    a: float = 1.0
    b: float = 1.0
    text: str = field(default="", compare=False, repr=False)
    """The user's spelling (stripped), when parsed from text."""

    def __post_init__(self) -> None:
        if self.kind not in TIME_KINDS:
            raise ValueError(
                f"time distribution kind must be one of {', '.join(TIME_KINDS)}, got {self.kind!r}"
            )
        for name in ("a", "b"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"time distribution parameter {name} must be a finite number, got {value!r}")
        if self.kind == "beta" and (self.a <= 0 or self.b <= 0):
            raise ValueError(f"Beta(a, b) needs a > 0 and b > 0, got a={self.a}, b={self.b}")
        if self.kind == "logit_normal" and self.b <= 0:
            raise ValueError(f"the logit-normal scale b must be > 0, got {self.b}")
        if self.kind == "power" and self.a <= 0:
            raise ValueError(f"the power exponent a must be > 0, got {self.a}")

    @classmethod
    def uniform(cls) -> Self:
        return cls("uniform")

    @classmethod
    def beta(cls, alpha: float, beta: float) -> Self:
        return cls("beta", alpha, beta)

    @classmethod
    def logit_normal(cls, loc: float = 0.0, scale: float = 1.0) -> Self:
        return cls("logit_normal", loc, scale)

    @classmethod
    def power(cls, exponent: float) -> Self:
        return cls("power", exponent)

    @classmethod
    def parse(cls, text: str) -> Self:
        """``"uniform"``, ``"beta:A,B"``, ``"logit_normal[:LOC,SCALE]"`` (default 0, 1), ``"power:EXPONENT"``.

        Raises:
            ValueError: an unknown kind, a wrong number of parameters, or parameters out of range.
        """
        spelt = text.strip()
        kind, _, rest = spelt.partition(":")
        if kind not in TIME_KINDS:
            raise ValueError(f"time distribution {text!r}: kind must be one of {', '.join(TIME_KINDS)}")
        try:
            values = [float(v) for v in rest.split(",")] if rest.strip() else []
        except ValueError:
            raise ValueError(f"time distribution {text!r}: parameters must be numbers") from None
        if kind == "logit_normal" and not values:
            values = [0.0, 1.0]
        wanted = _PARAMETERS[kind]
        if len(values) != wanted:
            raise ValueError(f"time distribution {text!r}: {kind} takes {wanted} parameter(s)")
        a, b = [*values, 1.0, 1.0][:2]
        return cls(kind, a, b, text=spelt)

    def __str__(self) -> str:
        if self.text:
            return self.text
        numbers = (self.a, self.b)[: _PARAMETERS[self.kind]]
        return f"{self.kind}:{','.join(_number(v) for v in numbers)}" if numbers else self.kind


def _number(value: float) -> str:
    """The short spelling (``1``, ``0.5``) where it reads back exactly, else the exact one."""
    short = f"{value:g}"
    return short if float(short) == value else repr(float(value))
