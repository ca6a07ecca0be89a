"""The fleet simulator that evaluates routing policies offline: a world (calibration,
scenarios, simulator) and the routers compared in it (baselines, evaluation)."""
