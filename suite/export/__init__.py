"""``python -m suite.export RUN_DIR ...``: W&B runs from run records (``__main__``; the writing is
``suite.record.wandb_export``'s)."""
