"""Per rank: process group, the training loop, checkpoints. Run by submitit tasks, or
``torchrun --nproc_per_node N -m suite.train RECIPE``."""
