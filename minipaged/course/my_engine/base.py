"""What every check of ``my_engine`` shares: the stages, a failed case, a check and its result."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

PACKAGE = "my_engine"

# stage -> (module stem, what it builds)
STAGES: dict[int, tuple[str, str]] = {
    0: ("stage0_contiguous", "the contiguous cache"),
    1: ("stage1_block_pool", "the block pool: free queue, ref counts"),
    2: ("stage2_block_table", "block tables"),
    3: ("stage3_attention", "slot mapping and paged attention in torch"),
    4: ("stage4_kernels", "the Triton kernels (Triton track)"),
    5: ("stage5_scheduler", "the KV door and the scheduler"),
    6: ("stage6_prefix_cache", "the prefix cache"),
}


class CheckFailed(AssertionError):
    """A case the learner's code gets wrong: what it was, what was expected, what came back, and a hint."""

    def __init__(self, case: str, want: object, got: object, hint: str = "") -> None:
        self.case, self.want, self.got, self.hint = case, want, got, hint
        lines = [case, f"  want {_short(want)}", f"  got  {_short(got)}"]
        if hint:
            lines.append(f"  likely mistake: {hint}")
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class Check:
    name: str
    level: str  # "core" or "stretch"
    run: Callable[[ModuleType], None]


@dataclass(frozen=True)
class Result:
    stage: int
    name: str
    level: str
    status: str  # "pass", "todo" (a stub not written yet) or "fail"
    message: str = ""


def _short(value: object, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def outcome(call: Callable[[], Any], errors: tuple[type[BaseException], ...], name: str) -> object:
    """What ``call()`` returns, or ``name`` when it raises one of ``errors``."""
    try:
        return call()
    except errors:
        return name


def must_raise(call: Callable[[], object], errors: tuple[type[BaseException], ...], case: str, hint: str) -> None:
    try:
        call()
    except errors:
        return
    raise CheckFailed(case, " or ".join(e.__name__ for e in errors), "no error", hint)


def free_queue_ids(pool: Any) -> list[int]:
    queue = getattr(pool, "free_block_queue", None)
    if queue is None:
        queue = pool.free_queue
    return [b.block_id for b in queue]
