"""``python -m daskgpu._cli.bench``: the same as ``daskgpu bench``."""

import sys

from daskgpu._cli.bench.command import main

sys.exit(main())
