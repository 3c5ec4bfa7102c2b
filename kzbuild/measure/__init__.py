"""Measurements: bench, interleaved A/B, roll, profile, plans, statistics and the results store."""
