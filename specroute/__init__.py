"""The `specroute` command and the local stack launcher: the parts that import every
other part (gateway, workers, bench). Nothing in gateway/, policies/ or workers/
imports this package."""
