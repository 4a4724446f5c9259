"""The submitting side: the command line, submitit launch, following jobs. Never imports the
per-rank code (suite.train) or torch-heavy tracking: it reads the run record files."""
