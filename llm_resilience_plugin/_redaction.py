"""Secret redaction, applied where data enters the plugin's records and again where it is printed.

Values under secret-looking keys (``api_key``, ``authorization``, ...) are replaced, registered
secrets (the API keys of every router built in this process) are scrubbed from every string, and
strings that look like provider keys (``sk-...``, ``Bearer ...``) are masked.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from datetime import datetime
from typing import Any

REDACTED = "[REDACTED]"

_SECRET_KEY_RE = re.compile(
    r"(api[_-]?key|apikey|secret|password|passwd|authorization|auth[_-]?token|access[_-]?token|"
    r"refresh[_-]?token|bearer|credential|private[_-]?key|x-api-key|aws_secret|session[_-]?token)",
    re.IGNORECASE,
)
_NOT_SECRET_KEYS = frozenset({"idempotency_key", "request_key", "key_id", "budget_key"})
_KEY_LIKE_RE = re.compile(
    r"\b(sk|pk|rk)-[A-Za-z0-9_\-]{6,}|\bBearer\s+[A-Za-z0-9._\-]{8,}|\bAKIA[0-9A-Z]{12,}"
)

_secrets: set[str] = set()
MIN_SECRET_BODY = 16  # the shortest part of a key after a dash that is scrubbed on its own
_secrets_lock = threading.Lock()
_secret_re: re.Pattern[str] | None = None


def register_secret(value: str | None) -> None:
    """Scrub ``value`` from every string this module redacts (API keys of attached routers)."""
    global _secret_re
    if not isinstance(value, str) or len(value) < 4:
        return
    # A provider may echo a key without its prefix ("sk-", "sk-proj-", ...): its body after a
    # dash is scrubbed too, when long enough not to match ordinary text.
    parts = {value, *(value.split("-", i)[-1] for i in range(1, value.count("-") + 1))}
    new = {p for p in parts if p == value or len(p) >= MIN_SECRET_BODY}
    with _secrets_lock:
        if new <= _secrets:
            return
        _secrets.update(new)
        _secret_re = re.compile("|".join(re.escape(s) for s in sorted(_secrets, key=len, reverse=True)))


def scrub(text: str) -> str:
    """``text`` with registered secrets, key-shaped tokens and URL credentials masked."""
    pat = _secret_re
    if pat is not None:
        text = pat.sub(REDACTED, text)
    return mask_url(_KEY_LIKE_RE.sub(_mask, text)) or ""


def _mask(m: re.Match[str]) -> str:
    token = m.group(0)
    return "Bearer ***" if token.startswith("Bearer") else token[:3] + "***"


def is_secret_key(key: str) -> bool:
    """Does ``key`` name a secret (and not one of the plugin's own non-secret keys)?"""
    return key not in _NOT_SECRET_KEYS and bool(_SECRET_KEY_RE.search(key))


def redact(value: Any, _depth: int = 0) -> Any:
    """A JSON-safe copy of ``value`` with secrets removed (see the module docstring)."""
    if _depth > 12:
        return "..."
    if isinstance(value, str):
        return scrub(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            ks = str(k)
            out[ks] = REDACTED if is_secret_key(ks) and v not in (None, "") else redact(v, _depth + 1)
        return out
    if isinstance(value, list | tuple | set | frozenset):
        return [redact(v, _depth + 1) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        try:
            return redact(to_dict(), _depth + 1)
        except Exception:
            pass
    return scrub(str(value))


def safe_metadata(md: Mapping[str, Any] | None) -> dict[str, Any]:
    """Scalar metadata values worth logging (tenant, user, feature, ...), without LangChain's
    internals (``ls_*``, ``lc_*``, ``langgraph_*``) and without secrets."""
    out: dict[str, Any] = {}
    for k, v in (md or {}).items():
        ks = str(k)
        if ks.startswith(("ls_", "lc_", "langgraph_", "checkpoint_", "_llm_resilience")):
            continue
        if isinstance(v, str | int | float | bool) or v is None:
            out[ks] = REDACTED if is_secret_key(ks) else v
    return out


def redact_mapping(value: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``value`` with secrets removed (values under secret keys, secrets in strings)."""
    out = redact(value)
    return out if isinstance(out, dict) else {}


_URL_CREDENTIALS_RE = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.\-]*://)(?P<userinfo>[^/@\s]+)@")


def url_has_credentials(url: str | None) -> bool:
    """Does ``url`` carry ``user:password@`` (or a token) before its host?"""
    return bool(url) and _URL_CREDENTIALS_RE.search(str(url)) is not None


def mask_url(url: str | None) -> str | None:
    """``url`` with any credentials before the host replaced by ``***``."""
    if url is None:
        return None
    return _URL_CREDENTIALS_RE.sub(lambda m: f"{m.group('scheme')}***@", str(url))
