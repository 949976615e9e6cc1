"""The attention backend interface as the engine drives it: ``plan`` once per step, then
``store_kvcache`` and one ``attend`` per layer, whatever mix of prefill and decode the step holds."""

from __future__ import annotations

import torch

from minipaged import LLM, SamplingParams
from minipaged.attention.batched import BatchPlan, TorchBackend
from minipaged.attention.cache_attention import PagedMetadata
from minipaged.engine.plugins import EnginePlugins
from minipaged.tiny.task import prompt_for


class SpyBackend(TorchBackend):
    """The torch backend, recording each step's q_lens and how many layers attended in it."""

    name = "spy"

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[list[int]] = []  # the q_lens of each planned step
        self.attends: list[int] = []  # attend calls in each step

    def plan(self, meta: PagedMetadata, block_size: int) -> BatchPlan:
        self.steps.append(list(meta.host_q_lens))
        self.attends.append(0)
        return super().plan(meta, block_size)

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: PagedMetadata, plan: BatchPlan
    ) -> torch.Tensor:
        assert meta.host_q_lens == self.steps[-1], "attend got another step's metadata than the last plan"
        self.attends[-1] += 1
        return super().attend(q, k_cache, v_cache, meta, plan)


def test_attend_is_called_once_per_layer_per_step_for_prefill_and_decode_steps():
    prompts = [prompt_for("paged kv"), prompt_for("hello world", "xyz ")]
    params = SamplingParams(temperature=0, max_tokens=5)
    kw = dict(block_size=4, num_kvcache_blocks=64, max_num_seqs=2)
    want = [o.outputs[0].token_ids for o in LLM(**kw).generate(prompts, params, use_tqdm=False)]
    spy = SpyBackend()
    llm = LLM(plugins=EnginePlugins(attention_backend=spy), **kw)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == want and all(len(ids) == 5 for ids in got)
    layers = llm.model.config.num_hidden_layers
    assert spy.attends == [layers] * len(spy.steps)
    # both prompts prefilled together, then four decode steps of one token each
    assert spy.steps == [[len(llm.tokenizer.encode(p)) for p in prompts]] + [[1, 1]] * 4
