"""Built-in tool plugins, registered through the ``rstar_env`` entry-point group like a user's."""

from rstar_env.plugins import hookimpl
from rstar_plugins.tools.python import PythonOptions, PythonTool
from rstar_plugins.tools.python_stdio import PythonStdIOOptions, PythonStdIOTool


@hookimpl
def rstar_env_tools() -> list[type]:
    return [PythonTool, PythonStdIOTool]


__all__ = ["PythonOptions", "PythonStdIOOptions", "PythonStdIOTool", "PythonTool"]
