"""``python -m suite.doctor``: a health check of a new machine or cluster before any study.

What it checks, each in its own module: the software and devices present (``versions``), the
network interface the backends would use (``network``), the collectives on N local ranks, exact
and timed (``collectives``, on ranks started by ``ranks``), and a parity smoke of ddp, fsdp and
zero2 against single (``parity``). ``report`` holds the check record, the table and the JSON;
``checkup`` runs them in order; ``__main__`` is the command line.
"""
