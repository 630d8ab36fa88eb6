"""Built-in tool plugins, registered through the ``rstar_env`` entry-point group like a user's."""

from rstar_plugins.tools.python import PythonTool

from rstar_env.plugins import hookimpl


@hookimpl
def rstar_env_tools() -> list[type]:
    return [PythonTool]


__all__ = ["PythonTool"]
