"""`python -m parity.harness.cli ...`: the `parity` command in a fresh interpreter."""

import sys

from parity.harness.cli import main

sys.exit(main())
