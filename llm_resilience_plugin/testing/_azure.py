"""Azure OpenAI's dialect: ``POST /<deployment>/openai/deployments/<azure deployment>/chat/completions
?api-version=...`` with an ``api-key`` header (redacted in the log), served by the chat handler.

Azure's request and response bodies are OpenAI's; a request without ``api-version`` gets Azure's
404 ``Resource not found``. LiteLLM sends an ``azure/<name>`` model here when its ``api_base`` is
``http://127.0.0.1:<port>/<deployment>``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

__all__ = ["add_azure_routes"]


def add_azure_routes(
    app: web.Application, handle_chat: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> None:
    """Register Azure OpenAI's chat-completions path on ``app``."""

    async def chat(request: web.Request) -> web.StreamResponse:
        if not request.query.get("api-version"):
            return web.json_response({"error": {"code": "404", "message": "Resource not found"}}, status=404)
        return await handle_chat(request)

    app.router.add_post("/{deployment}/openai/deployments/{azure_deployment}/chat/completions", chat)
