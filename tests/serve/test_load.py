"""Many clients at once: 64 streaming clients x 4 requests each, through the official client.

Every request completes, every stream equals its offline result (text and token count: nothing
lost, nothing sent twice), and afterwards every block is free. Bounded in count and time; no
speed is asserted (``bench serve`` measures that).
"""

from __future__ import annotations

import asyncio
import random

import pytest
from serve.harness import ENGINE, wait_idle

from minipaged import SamplingParams
from minipaged.tiny import task

openai = pytest.importorskip("openai")

CLIENTS, PER_CLIENT, MAX_TOKENS = 64, 4, 16
TIME_LIMIT = 900  # seconds for all 256 requests: a hang fails, a slow machine does not


def workload() -> list[list[str]]:
    rng = random.Random(5)
    preamble = "shared lesson prompt. " * 2
    return [
        [
            task.prompt_for(task.random_text(rng, 1, 12), preamble if rng.random() < 0.5 else "")
            for _ in range(PER_CLIENT)
        ]
        for _ in range(CLIENTS)
    ]


async def one_client(url: str, prompts: list[str]) -> list[tuple[str, int]]:
    c = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=TIME_LIMIT)
    got = []
    try:
        for prompt in prompts:
            stream = await c.completions.create(
                model="tiny-copy", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True,
                stream_options={"include_usage": True},
            )  # fmt: skip
            text, tokens = "", None
            async for chunk in stream:
                text += "".join(ch.text for ch in chunk.choices)
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
            got.append((text, tokens))
    finally:
        await c.close()
    return got


@pytest.mark.slow
def test_64_streaming_clients_get_their_offline_results_and_free_every_block(server, offline):
    prompts = workload()
    flat = [p for client in prompts for p in client]
    outs = offline.generate(flat, SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False)
    want = [(o.outputs[0].text, len(o.outputs[0].token_ids)) for o in outs]

    async def everyone():
        return await asyncio.gather(*(one_client(server.url, p) for p in prompts))

    results = asyncio.run(asyncio.wait_for(everyone(), TIME_LIMIT))
    got = [r for client in results for r in client]
    assert len(got) == CLIENTS * PER_CLIENT
    wrong = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    assert not wrong, f"{len(wrong)} streams differ from LLM.generate, e.g. {got[wrong[0]]} != {want[wrong[0]]}"
    m = wait_idle(server, ENGINE["num_kvcache_blocks"])
    assert m["requests_finished_total"] == CLIENTS * PER_CLIENT
    assert m["requests_aborted_total"] == m["requests_failed_total"] == 0
    assert m["generation_tokens_total"] == sum(n for _, n in want)
