"""A user's own model and data set, outside the suite: what ``examples/custom_model.yaml`` trains."""
