"""`python -m parity.rollout FILE...`: the rollout lane (rollout/lane.py)."""

import sys

from parity.rollout.lane import main

if __name__ == "__main__":
    sys.exit(main())
