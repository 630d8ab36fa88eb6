"""Built-in plugins of rstar-env, registered through the `rstar_env` entry-point group like any other."""
