"""``torchrun --nproc_per_node N -m suite.train RECIPE [key=value ...]``: the rank-side entry point
lives with the other rank tasks (``suite.tasks.torchrun``), above the planner, whose prediction
rank 0 records after training; this keeps the command's name.

It ends through ``run_command``: the record and tracking are flushed by then (``atexit`` handlers
run first), and the interpreter's teardown is skipped. That teardown is where a gloo worker thread
can drop a tensor after Python has begun tearing down and abort a rank that completed (SIGABRT,
"terminate called without an active exception"; seen once under torchrun in a full test run),
which torchrun then reports as a failed job. The local executor's warm ranks end the same way."""
from suite.common.exit import run_command
from suite.tasks.torchrun import main

if __name__ == "__main__":
    run_command(main)
