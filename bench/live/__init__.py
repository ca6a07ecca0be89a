"""`specroute bench live`: the adaptive gateway against equal homogeneous fleets and a
held-out oracle on running stacks (run), with its fleets, prompts, arithmetic (stats) and
report."""
