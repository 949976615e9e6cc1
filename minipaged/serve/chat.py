"""Chat messages -> one prompt, with the checkpoint's own chat template.

A Hugging Face checkpoint that was tuned for chat ships a Jinja template (``chat_template`` in
``tokenizer_config.json``, or a ``chat_template.jinja`` file) that lays the messages out the way
the model saw them in training. It is rendered here as transformers and vLLM render it: in a
sandbox, with ``add_generation_prompt=True`` so that the prompt ends where the assistant's
answer starts. A checkpoint without a template (the embedded copy model is one) has no chat
endpoint: ``/v1/chat/completions`` answers 400 and says so.
"""

from __future__ import annotations

import json
from pathlib import Path

from minipaged.serve.protocol import APIError


def _token_text(value: object) -> str:
    """``bos_token`` and friends are a string, or a dict with the string in ``content``."""
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return value if isinstance(value, str) else ""


class ChatTemplate:
    def __init__(self, source: str, special: dict[str, str]) -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        self.template = env.from_string(source)
        self.special = special

    @classmethod
    def from_folder(cls, folder: Path | None) -> ChatTemplate | None:
        """The folder's chat template, or None if it has none."""
        if folder is None:
            return None
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
        source = config.get("chat_template")
        if isinstance(source, list):  # named templates: take the default one
            source = next((t.get("template") for t in source if t.get("name") == "default"), None)
        if source is None and (folder / "chat_template.jinja").exists():
            source = (folder / "chat_template.jinja").read_text()
        if not source:
            return None
        special = {k: _token_text(config.get(k)) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
        return cls(source, special)

    def render(self, messages: list[dict]) -> str:
        from jinja2 import TemplateError

        try:
            return self.template.render(messages=messages, add_generation_prompt=True, **self.special)
        except TemplateError as e:
            raise APIError(400, f"messages: the model's chat template refused them ({e})", "messages") from None


def _raise(message: str) -> None:
    from jinja2 import TemplateError

    raise TemplateError(message)
