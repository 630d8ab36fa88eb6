"""openenv-core, imported without its Gradio web UI unless ``ENABLE_WEB_INTERFACE`` asks for it.

openenv's server package imports its web interface, and with it Gradio, whenever Gradio is installed, which
openenv-core's own requirements make always: about 2.5 s of a server's 4.5 s start, and of every client's import.
openenv treats a Gradio that cannot be imported as "no web UI", and its server imports the web interface again
when ``ENABLE_WEB_INTERFACE`` is set, so Gradio is hidden from that one first import only, and only when the web
UI is off. Import this module before any ``openenv`` import.
"""

from __future__ import annotations

import os
import sys

WEB_UI_ON = ("true", "1", "yes")
"""The values of ``ENABLE_WEB_INTERFACE`` that turn openenv's web UI on (as openenv reads them)."""


def _import_without_web_ui() -> None:
    if "openenv.core" in sys.modules or "gradio" in sys.modules:
        return  # already imported (the UI with it, or Gradio for another reason): nothing to save
    if os.environ.get("ENABLE_WEB_INTERFACE", "false").lower() in WEB_UI_ON:
        return
    sys.modules["gradio"] = None  # type: ignore[assignment]  # `import gradio` raises ModuleNotFoundError
    try:
        import openenv.core.env_server  # noqa: F401
    except ModuleNotFoundError:
        pass  # openenv-core is missing: the importer's own import names the serve extra
    finally:
        if sys.modules.get("gradio", ...) is None:
            del sys.modules["gradio"]


_import_without_web_ui()
