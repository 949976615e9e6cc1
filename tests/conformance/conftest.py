"""The conformance tests run the embedded 2M-parameter model a few tokens at a time: one torch
thread each, as the engine's own decode path does for small products (minipaged/attention/
batched.py). A thread pool splitting such work waits on busy cores; the count is put back after."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
