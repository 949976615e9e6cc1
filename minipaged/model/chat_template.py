"""Chat messages -> one prompt string, with the model's own chat template.

A model tuned for chat ships a Jinja template (``chat_template`` in a Hugging Face folder's
``tokenizer_config.json`` or its ``chat_template.jinja`` file; ``tokenizer.chat_template`` in a
GGUF file's metadata) that lays the messages out the way the model saw them in training. It is
rendered here as transformers and vLLM render it: in a sandbox, with ``trim_blocks`` and
``lstrip_blocks``, and with ``add_generation_prompt=True`` the prompt ends where the assistant's
answer starts. The rendered text already holds the special tokens: encode it with
``add_special_tokens=False``. A model without a template (the embedded copy model) cannot chat.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path


def _token_text(value: object) -> str:
    """``bos_token`` and friends are a string, or a dict with the string in ``content``."""
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return value if isinstance(value, str) else ""


class ChatTemplate:
    """A compiled template and the special-token strings it may name (``bos_token``, ``eos_token`` ...)."""

    def __init__(self, source: str, special: Mapping[str, str]) -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        self.source = source
        self.template = env.from_string(source)
        self.special = dict(special)

    @classmethod
    def from_folder(cls, folder: Path | None) -> ChatTemplate | None:
        """A Hugging Face folder's chat template, or None if it has none."""
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

    def render(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
        """The prompt text for ``messages`` (``[{"role": "user", "content": "..."}, ...]``).

        Raises ``ValueError`` when the template refuses them (e.g. roles out of order).
        """
        from jinja2 import TemplateError

        try:
            return self.template.render(
                messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt, **self.special
            )
        except TemplateError as e:
            raise ValueError(f"messages: the model's chat template refused them ({e})") from None


def _raise(message: str) -> None:
    from jinja2 import TemplateError

    raise TemplateError(message)
