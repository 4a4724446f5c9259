"""``torchrun --nproc_per_node N -m suite.train RECIPE [key=value ...]``: the rank-side entry point
lives with the other rank tasks (``suite.tasks.torchrun``), above the planner, whose prediction
rank 0 records after training; this keeps the command's name."""
import sys

from suite.tasks.torchrun import main

if __name__ == "__main__":
    sys.exit(main())
