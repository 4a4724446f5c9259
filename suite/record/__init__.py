"""Recording: the run record (torch-free: read by the submitting side and analysis), metric
definitions, the utilisation thread and the W&B sink."""
