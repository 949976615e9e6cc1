"""The PagedAttention paper's results beside ours: ``python -m minipaged paper [NAME ...] [--quick]``.

Kwon et al., "Efficient Memory Management for Large Language Model Serving with PagedAttention"
(SOSP'23, arXiv 2309.06180) measured OPT-13B on A100 GPUs; this package reproduces each result
on a laptop CPU and prints it beside the paper's number, saying whether ours is **simulated**
(a memory-only replay of :mod:`minipaged.sim`, no model) or **measured** (the real engine).
One module per idea: :mod:`.kv_bytes` (§3), :mod:`.reservation` (Fig. 2, Fig. 13),
:mod:`.serving` (Fig. 12), :mod:`.sharing` (Fig. 15), :mod:`.shared_prefix` (Fig. 16),
:mod:`.block_size` (Fig. 18b), :mod:`.preemption` (Fig. 19), :mod:`.regime` (why a
bandwidth-bound model shows paging's throughput); :mod:`.registry` names them, :mod:`.cli`
runs them, :mod:`.plots` draws what they saved. docs/paper.md puts every result in one table.
"""
