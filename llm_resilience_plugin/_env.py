"""Process settings that must be in place before LiteLLM is first imported.

LiteLLM fetches its model price map from the network at import time unless told to use the
bundled copy; this package never reaches the network, so it sets that (and the offline mode that
stops tokenizer downloads) once, here, before anything imports ``litellm``.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")
os.environ.setdefault("LITELLM_LOG", "ERROR")


def allow_loopback() -> None:
    """Keep proxies away from 127.0.0.1/localhost (LiteLLM's aiohttp transport honours HTTP_PROXY)."""
    for key in ("NO_PROXY", "no_proxy"):
        current = [p for p in os.environ.get(key, "").split(",") if p]
        for host in ("127.0.0.1", "localhost"):
            if host not in current:
                current.append(host)
        os.environ[key] = ",".join(current)
