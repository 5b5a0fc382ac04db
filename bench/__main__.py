"""``python -m bench``."""

import sys

from bench.cli import main
from bench.procs import stop_on_sigterm

if __name__ == "__main__":
    stop_on_sigterm()
    sys.exit(main())
