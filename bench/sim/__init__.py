"""The fleet simulator that evaluates routing policies offline: a world (calibration,
scenarios, simulator) and the routers compared in it (router: the policy seam it drives,
baselines, evaluation); the benches run on it (`specroute bench policy`: policy, its
`--fleet` run: fleet) and the measurement of its calibration on this repository's
engine (calibrate)."""
