"""``python -m suite.study STUDY.yaml``: run a published comparison's arms and report it (``__main__``)."""
