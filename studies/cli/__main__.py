"""``python -m studies.cli`` = ``spml`` (worker processes are started this way)."""

import sys

from studies.cli import main

sys.exit(main())
