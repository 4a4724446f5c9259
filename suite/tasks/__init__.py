"""The rank side's entry points: what runs inside each rank's process, whoever started it.

- ``train.TrainTask``: a submitit task (local or Slurm): joins the job's rendezvous, trains one rank.
- ``pool``: a warm pool of ranks that trains the points of a sweep one after another.
- ``mpi``: a rank started by mpirun (``python -m suite.tasks.mpi SPEC``).
- ``torchrun``: ``torchrun -m suite.train RECIPE`` (``suite/train/__main__.py`` hands over here).

They sit above the planner: after training, rank 0 records the planner's prediction for the run
(``suite.planner.predict``), which ``suite.train`` itself, below the planner, cannot import.
"""
