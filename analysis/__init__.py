"""Analysis of run records: tables, plots and an HTML report (``python -m analysis.report``).

Reads only files (run records, offline W&B runs through wandb's CLI in a subprocess) and
never imports torch, so it runs anywhere the runs were copied to.
"""
