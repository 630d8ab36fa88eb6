"""Built-in reward (verifier) plugins."""
