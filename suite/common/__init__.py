"""The bottom layer beside ``compat`` and ``record``: the suite's error types, the user-factory
contract (``target: pkg.module:fn``), MPI's communicator and a free port. Imports nothing of the suite."""
