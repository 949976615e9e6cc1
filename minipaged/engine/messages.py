"""Chat messages in, checked and rendered: what :meth:`LLM.chat` hands to ``generate``.

A conversation is a list of messages, each a dict ``{"role": ..., "content": ...}`` (OpenAI's
and vLLM's shape); ``LLM.chat`` takes one conversation or a list of them::

    [{"role": "system", "content": "Answer in one sentence."},
     {"role": "user", "content": "What is the capital of France?"}]

The model's chat template (:mod:`minipaged.model.chat_template`) lays a conversation out as one
prompt string, special tokens included, so it is encoded with ``add_special_tokens=False`` (a
second BOS would be a token the model never saw in training). Every conversation is checked and
rendered before any is queued: a bad one raises and nothing runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence as Seq
from typing import Any, cast

from minipaged.model.chat_template import ChatTemplate
from minipaged.model.hub import DEFAULT_CHAT_MODEL

ROLES = ("system", "user", "assistant", "tool")
Message = Mapping[str, str]
Conversation = Seq[Message]


def as_conversations(messages: Conversation | Seq[Conversation]) -> list[list[dict[str, str]]]:
    """One conversation or a list of them -> a list of checked conversations (copies).

    Raises ``TypeError`` / ``ValueError`` saying which message of which conversation is wrong.
    """
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Seq) or not messages:
        raise TypeError(
            "messages must be a conversation (a list of {'role': ..., 'content': ...} dicts) or a list of "
            f"conversations, got {_shown(messages)}"
        )
    one = isinstance(messages[0], Mapping)
    conversations = [messages] if one else list(messages)
    return [_checked(c, i, one) for i, c in enumerate(conversations)]


def _checked(conversation: object, index: int, one: bool) -> list[dict[str, str]]:
    where = "" if one else f"conversation {index}: "
    if isinstance(conversation, (str, bytes, Mapping)) or not isinstance(conversation, Seq):
        raise TypeError(f"{where}a conversation must be a list of messages, got {_shown(conversation)}")
    if not conversation:
        raise ValueError(f"{where}a conversation needs at least one message")
    checked = []
    for j, m in enumerate(conversation):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise TypeError(f"{where}message {j} must be a dict with 'role' and 'content', got {_shown(m)}")
        if m["role"] not in ROLES:
            raise ValueError(f"{where}message {j} has role {m['role']!r}; the roles are {', '.join(ROLES)}")
        if not isinstance(m["content"], str):
            raise TypeError(f"{where}message {j}: content must be a string, got {_shown(m['content'])}")
        checked.append({"role": str(m["role"]), "content": m["content"]})
    return checked


def _shown(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def template_of(tokenizer: Any, chat_template: str | None = None) -> ChatTemplate:
    """The template to render with: ``chat_template`` (Jinja source) if given, else the model's own."""
    own = getattr(tokenizer, "chat_template", None)
    if chat_template is None and own is None:
        raise ValueError(
            "this model has no chat template, so it cannot chat (the embedded model copies text, it was never "
            f"tuned for chat): load a chat model, e.g. LLM({DEFAULT_CHAT_MODEL!r}), pass chat_template=..., "
            "or use generate() with a prompt string"
        )
    if chat_template is None:
        return cast(ChatTemplate, own)
    if tokenizer is None:
        raise ValueError("chat needs a tokenizer to encode the rendered prompt; this model has none")
    from jinja2 import TemplateError

    try:
        return ChatTemplate(chat_template, own.special if own is not None else {})
    except TemplateError as e:
        raise ValueError(f"chat_template is not a valid Jinja template: {e}") from None


def render(
    conversations: list[list[dict[str, str]]], template: ChatTemplate, tokenizer: Any, add_generation_prompt: bool
) -> list[tuple[str, list[int]]]:
    """Each conversation -> (its prompt text, its token ids), special tokens taken from the text."""
    rendered = []
    for i, conversation in enumerate(conversations):
        try:
            text = template.render(conversation, add_generation_prompt=add_generation_prompt)
        except ValueError as e:
            raise ValueError(f"conversation {i}: {e}" if len(conversations) > 1 else str(e)) from None
        rendered.append((text, tokenizer.encode(text, add_special_tokens=False)))
    return rendered
