"""Training of the per-request drafter predictor (policies/predictor.py): offline only,
never imported by runtime code."""
