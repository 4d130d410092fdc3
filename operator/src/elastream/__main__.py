"""`python -m elastream` runs the CLI."""

import sys

from elastream.cli import main

sys.exit(main())
