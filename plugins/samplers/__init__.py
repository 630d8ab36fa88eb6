"""Built-in group sampler plugins."""
