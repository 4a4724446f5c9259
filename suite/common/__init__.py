"""The bottom layer beside ``compat`` and ``record``: the suite's error types, the user-factory
contract (``target: pkg.module:fn``), MPI's communicator, a free port and whether a process is alive.
Imports nothing of the suite."""
