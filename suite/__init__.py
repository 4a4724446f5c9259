"""scalesuite: run, measure and compare distributed-training strategies."""
