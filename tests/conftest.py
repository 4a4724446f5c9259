import os

# Tests that do not test tracking run with W&B disabled; one thread per rank on 2 cores.
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
