"""Servers for other trainers: rstar-env's env, sandbox and verifier behind the protocols those trainers speak.

- ``rstar-env serve env``: the env as an OpenEnv environment server (multi-turn over the ``/ws`` WebSocket, one
  episode per session, token ids in the observation), with ``/run_code``, ``/run_jupyter`` and ``/verify`` beside it;
- ``rstar-env serve sandbox``: the sandbox behind SandboxFusion's ``/run_code`` and ``/run_jupyter`` (Python only),
  and ``/verify``;
- ``rstar-env serve verify``: the verifier alone at ``/verify``.

Every route of one server shares one warm sandbox pool and one reward plugin, built once at start
(:class:`~rstar_env.serve.resources.Resources`). Servers run model-written code, so they bind 127.0.0.1 unless given
a token (:mod:`rstar_env.serve.guard`). The servers need the ``serve`` extra (``pip install 'rstar-env[serve]'``);
``import rstar_env.serve`` alone imports none of it.
"""

SERVE_EXTRA_HINT = "install the serve extra: pip install 'rstar-env[serve]'"
"""What to tell a user whose environment lacks openenv-core or FastAPI."""


def import_openenv() -> None:
    """Import openenv-core without its Gradio web UI (unless ``ENABLE_WEB_INTERFACE`` turns it on): call it before
    importing OpenEnv's clients to save Gradio's 2.5 s. Importing ``rstar_env.serve.client`` does it too."""
    import rstar_env.serve._openenv  # noqa: F401
