"""``python -m trainer.distributed <engine argv>``: the scale-out trainer (:func:`trainer.dropin.scale_out.main`).

An entry point, run and never imported: the launcher it runs is the drop-in's (one rank under torchrun,
torchrun itself, or the ordinary trainer), which sits above this package."""

import sys

from trainer.dropin.scale_out import main

sys.exit(main())
