"""``python -m fastlease``: the ``fastlease`` command."""

import sys

from .cli import main

sys.exit(main())
