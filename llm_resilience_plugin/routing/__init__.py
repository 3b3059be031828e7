"""The :class:`ResilientRouter` facade over LiteLLM's Router, its streams and call reports."""

from llm_resilience_plugin.routing._router import REPORT_KEY, ResilientRouter, get_report
from llm_resilience_plugin.routing._streams import ResilientStream, StaticStream, SyncResilientStream

__all__ = [
    "REPORT_KEY",
    "ResilientRouter",
    "ResilientStream",
    "StaticStream",
    "SyncResilientStream",
    "get_report",
]
