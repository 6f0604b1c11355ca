"""Quality, distillation and scale-out benchmarks on top of the trainer and the game side; not installed
(the speed bench, which must work from a wheel, is :mod:`emulator.bench`)."""

__all__: list[str] = []
