"""``python -m trainer.distributed <engine argv>``: the scale-out trainer (:func:`trainer.distributed.main`)."""

import sys

from trainer.distributed.launch import main

sys.exit(main())
