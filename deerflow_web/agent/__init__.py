"""Agent side: middlewares and tools that give a LangChain agent the thread's files.

Importing this package never imports Flask; `langchain` itself is optional (the middlewares
subclass its `AgentMiddleware` only when it is installed).
"""

from __future__ import annotations

from deerflow_web.agent.middleware import ThreadDataMiddleware
from deerflow_web.agent.middleware import UploadsMiddleware
from deerflow_web.agent.middleware import make_upload_middleware
from deerflow_web.agent.tools import UploadTools
from deerflow_web.agent.tools import make_file_tools

__all__ = [
    "ThreadDataMiddleware",
    "UploadTools",
    "UploadsMiddleware",
    "make_file_tools",
    "make_upload_middleware",
]
