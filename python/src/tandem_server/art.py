"""OpenPipe ART against tandem: `TandemBackend` is ART's `ServerlessBackend` with tandem's address
and key filled in from the environment, so a script written for a hosted ART run needs only::

    from tandem_server.art import TandemBackend
    backend = TandemBackend()
    await model.register(backend)

The base URL is the `base_url` argument, else `TANDEM_BASE_URL`, else `http://127.0.0.1:8000/v1`.
The key is the `api_key` argument, else `TANDEM_API_KEY`, else the first line of the file
`TANDEM_API_KEY_FILE` (default `data/api-key`, which `tandem serve` writes on its first start).

Importing this module keeps ART local as tandem's examples do: it sets `WANDB_MODE=disabled`,
`WEAVE_DISABLED=true` and `LITELLM_LOCAL_MODEL_COST_MAP=True` unless they are set already.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WEAVE_DISABLED", "true")

import art  # noqa: E402  (the environment above is read at import)

__all__ = ["TandemBackend", "base_url_from_env", "api_key_from_env"]

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"


def base_url_from_env() -> str:
    return os.environ.get("TANDEM_BASE_URL") or DEFAULT_BASE_URL


def api_key_from_env() -> str:
    key = os.environ.get("TANDEM_API_KEY")
    if key:
        return key
    path = Path(os.environ.get("TANDEM_API_KEY_FILE") or "data/api-key")
    try:
        return path.read_text().strip().splitlines()[0]
    except (OSError, IndexError):
        raise RuntimeError(f"no tandem API key: set TANDEM_API_KEY, or TANDEM_API_KEY_FILE (read {path})") from None


class TandemBackend(art.ServerlessBackend):
    """ART's ServerlessBackend pointed at a tandem server."""

    def __init__(self, *, api_key: Optional[str] = None, base_url: Optional[str] = None, **kwargs):
        super().__init__(api_key=api_key or api_key_from_env(), base_url=base_url or base_url_from_env(), **kwargs)
