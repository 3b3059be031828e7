"""Secret redaction, applied where data enters the plugin's records and again where it is printed.

Values under secret-looking keys (``api_key``, ``authorization``, ...) are replaced, registered
secrets (the API keys of every open router, a call's own ``api_key`` while it runs) are scrubbed
from every string, and strings that look like provider keys (``sk-...``, ``Bearer ...``) or URL
credentials (``://user:pass@``, ``?key=...``) are masked.

Every pattern here starts with a literal (``k-``, ``Bearer``, ``AKIA``, ``://``, ``=``) and has no
nested repetition, so a scan is linear in the text: a 1 MB error body scrubs in a few
milliseconds. Registered secrets are found with ``str.find`` (C speed), one search per secret.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

REDACTED = "[REDACTED]"
# The most characters of one field (an exception's message, a log value) kept in a record: a
# provider echoing a 100 kB input or a proxy's error page is cut here, with a marker.
MAX_FIELD_CHARS = 32_768

_SECRET_KEY_RE = re.compile(
    r"(api[_-]?key|apikey|secret|password|passwd|authorization|auth[_-]?token|access[_-]?token|"
    r"refresh[_-]?token|bearer|credential|private[_-]?key|x-api-key|aws_secret|session[_-]?token)",
    re.IGNORECASE,
)
_NOT_SECRET_KEYS = frozenset({"idempotency_key", "request_key", "key_id", "budget_key"})
# Each alternative is its own pattern beginning with a literal, so the regex engine skips to the
# literal's occurrences; the word boundary before the token is a lookbehind placed after it.
_KEY_LIKE_RES = (
    re.compile(r"k-(?<=[spr]k-)(?<![A-Za-z0-9_][spr]k-)[A-Za-z0-9_\-]{6,}"),
    re.compile(r"Bearer(?<![A-Za-z0-9_]Bearer)\s+[A-Za-z0-9._\-]{8,}"),
    re.compile(r"AKIA(?<![A-Za-z0-9_]AKIA)[0-9A-Z]{12,}"),
)
_KEY_LIKE_MASKS = (lambda m: "k-***", lambda m: "Bearer ***", lambda m: "AKI***")

MIN_SECRET_BODY = 16  # the shortest part of a key after a dash that is scrubbed on its own


class SecretRegistry:
    """The secrets :func:`scrub` removes, each with a count of holders (a router, a call).

    Adding or releasing a secret is O(1) under a short lock; the tuple :func:`scrub` reads is
    rebuilt on the first scrub after a change. A secret is forgotten when its last holder lets go.
    """

    def __init__(self) -> None:
        self._held: dict[str, tuple[int, tuple[str, ...]]] = {}
        self._lock = threading.Lock()
        self._view: tuple[tuple[str, ...], ...] | None = ()

    def add(self, values: Iterable[str | None]) -> tuple[str, ...]:
        """Hold each usable value (4 characters or more); the values held, to :meth:`release`."""
        taken: list[str] = []
        with self._lock:
            for value in values:
                if not isinstance(value, str) or len(value) < 4:
                    continue
                count, needles = self._held.get(value, (0, ()))
                if not count:
                    needles = _needles(value)
                    self._view = None
                self._held[value] = (count + 1, needles)
                taken.append(value)
        return tuple(taken)

    def release(self, values: Iterable[str]) -> None:
        """Let go of values :meth:`add` returned; the last release forgets a secret."""
        with self._lock:
            for value in values:
                held = self._held.get(value)
                if held is None:
                    continue
                if held[0] <= 1:
                    del self._held[value]
                    self._view = None
                else:
                    self._held[value] = (held[0] - 1, held[1])

    def needles(self) -> tuple[tuple[str, ...], ...]:
        """Every held secret's search strings (the whole value first, then its bodies)."""
        view = self._view
        if view is None:
            with self._lock:
                view = self._view = tuple(n for _, n in self._held.values())
        return view

    def __len__(self) -> int:
        return len(self._held)


def _needles(value: str) -> tuple[str, ...]:
    """``value`` and, for a provider that echoes a key without its prefix (``sk-``,
    ``sk-proj-``), each part after a dash long enough not to match ordinary text; longest first."""
    parts = {value.split("-", i)[-1] for i in range(1, value.count("-") + 1)}
    bodies = sorted((p for p in parts if len(p) >= MIN_SECRET_BODY and p != value), key=len, reverse=True)
    return (value, *bodies)


SECRETS = SecretRegistry()


def register_secret(value: str | None) -> None:
    """Scrub ``value`` from every string this module redacts, for the life of the process."""
    SECRETS.add((value,))


class SecretHold:
    """Secrets held for one owner (a router until it closes, a call while it runs)."""

    __slots__ = ("_values",)

    def __init__(self, values: Iterable[str | None]) -> None:
        self._values: tuple[str, ...] = SECRETS.add(values)

    def release(self) -> None:
        """Forget the secrets no one else holds (idempotent)."""
        values, self._values = self._values, ()
        if values:
            SECRETS.release(values)


def scrub(text: str) -> str:
    """``text`` with registered secrets, key-shaped tokens and URL credentials masked (linear)."""
    for needles in SECRETS.needles():
        if needles[-1] not in text:  # the shortest needle is in every occurrence of the others
            continue
        for needle in needles:
            if needle in text:
                text = text.replace(needle, REDACTED)
    for pattern, mask in zip(_KEY_LIKE_RES, _KEY_LIKE_MASKS, strict=True):
        text = pattern.sub(mask, text)
    return mask_url(text) or ""


def scrub_field(text: str, limit: int = MAX_FIELD_CHARS) -> str:
    """:func:`scrub` of at most ``limit`` characters of ``text``, with a marker saying how many
    were cut (a record's field never carries, nor costs the scrubbing of, a whole 1 MB body)."""
    if len(text) > limit:
        text = f"{text[:limit]}... [{len(text) - limit} more characters not shown]"
    return scrub(text)


def is_secret_key(key: str) -> bool:
    """Does ``key`` name a secret (and not one of the plugin's own non-secret keys)?"""
    return key not in _NOT_SECRET_KEYS and bool(_SECRET_KEY_RE.search(key))


def redact(value: Any, _depth: int = 0) -> Any:
    """A JSON-safe copy of ``value`` with secrets removed (see the module docstring)."""
    if _depth > 12:
        return "..."
    if isinstance(value, str):
        return scrub_field(value)
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
    return scrub_field(str(value))


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


# Anchored on '://': the userinfo is what follows it up to '@' (no '/', '@' or space between).
_URL_CREDENTIALS_RE = re.compile(r"://(?P<userinfo>[^/@\s]+)@")
# Anchored on '=': a query-string parameter whose name says it is a credential.
_QUERY_SECRET_RE = re.compile(
    r"(?P<name>[?&;](?:key|code|sig|signature|token|api-key|api_key|apikey|access_token|auth|password|"
    r"secret|x-goog-api-key|subscription-key)=)[^&#\s\"'<>]+",
    re.IGNORECASE,
)


def url_has_credentials(url: str | None) -> bool:
    """Does ``url`` carry ``user:password@`` (or a token) before its host?"""
    return bool(url) and _URL_CREDENTIALS_RE.search(str(url)) is not None


def mask_url(url: str | None) -> str | None:
    """``url`` (or any text) with credentials before a host and credential query parameters
    (``?key=``, ``&sig=``, ...) replaced by ``***``."""
    if url is None:
        return None
    text = str(url)
    if "://" in text:
        text = _URL_CREDENTIALS_RE.sub("://***@", text)
    if "=" in text:
        text = _QUERY_SECRET_RE.sub(r"\g<name>***", text)
    return text


# Parameter names whose values are credentials although they do not say "key" or "secret".
_CREDENTIAL_PARAMS = re.compile(
    r"key|secret|token(?!s|izer)|credential|password|passwd|authorization", re.IGNORECASE
)
_HEADER_PARAMS = frozenset({"extra_headers", "headers", "default_headers"})


def is_credential_param(name: str) -> bool:
    """Does a deployment parameter ``name`` hold a credential (``api_key``, ``aws_*``,
    ``vertex_credentials``, ``azure_ad_token``, ...; per-token prices excluded)?"""
    name = name.replace("per_token", "")
    return bool(_CREDENTIAL_PARAMS.search(name)) or (name.startswith("aws_") and name not in _AWS_PLAIN)


_AWS_PLAIN = frozenset({"aws_region_name", "aws_bedrock_runtime_endpoint", "aws_sts_endpoint"})


def is_call_secret(name: str) -> bool:
    """Does a call's (or deployment's) parameter ``name`` carry a credential or header values?"""
    return name in _HEADER_PARAMS or is_credential_param(name)


def credential_values(params: Mapping[str, Any]) -> list[str]:
    """Every secret string in a deployment's (or a call's) parameters: credential values,
    header values, and the string values inside a JSON credential blob (``os.environ/NAME``
    references are returned as given; resolve them where the environment is read)."""
    out: list[str] = []
    for name, value in params.items():
        if name in _HEADER_PARAMS and isinstance(value, Mapping):
            out.extend(v for v in value.values() if isinstance(v, str))
        elif is_credential_param(str(name)):
            out.extend(_strings_of(value))
    return out


def _strings_of(value: Any) -> list[str]:
    """``value`` if a string, plus the strings inside it when it is a JSON object or a mapping."""
    if isinstance(value, str):
        inner: Any = None
        if value.lstrip().startswith("{"):
            try:
                inner = json.loads(value)
            except ValueError:
                inner = None
        return [value, *(_strings_of(inner) if isinstance(inner, Mapping) else [])]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _strings_of(v)]
    return []


def mask_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """A deployment's parameters fit to show: credentials left out, header values replaced by
    ``***``, URL credentials and credential query parameters masked."""
    out: dict[str, Any] = {}
    for name, value in params.items():
        if is_credential_param(str(name)):
            continue
        if name in _HEADER_PARAMS and isinstance(value, Mapping):
            out[name] = {k: "***" for k in value}
        elif isinstance(value, str):
            out[name] = mask_url(value)
        else:
            out[name] = value
    return out
