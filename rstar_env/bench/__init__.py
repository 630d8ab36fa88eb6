"""Benchmarks behind `rstar-env bench ...`: each module exposes a click command named for its target."""
