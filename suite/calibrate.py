"""``python -m suite.calibrate``: this cluster's compute rate and collective costs (``suite.planner.calibrate``)."""
import sys

from suite.planner.calibrate import main

if __name__ == "__main__":
    sys.exit(main())
