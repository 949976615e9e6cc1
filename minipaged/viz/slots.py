"""Stage 3 pictures: where each new token's K/V lands in the pool (slot mapping).

:func:`draw_slot_mapping`: one batch's tokens on top, the pool's slots below grouped by block, an
arrow from every token to its slot (padding, slot -1, is shown as skipped); :func:`draw_pool_fill`:
small multiples of the pool as a prefill, then decode steps, fill it. Plain lists in, ``Figure`` out.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

from minipaged.viz.palette import FREE, MUTED, WASTE, owner_color, text_color
from minipaged.viz.style import SMALL, new_figure, new_grid

GAP = 0.7  # horizontal gap between two blocks of slots (and between two sequences' tokens), in slot widths


def _name(i: int, seq_names: Sequence[str] | None) -> str:
    """``seq_names[i]``, or A, B, C, ... (``s26`` and up past Z)."""
    return seq_names[i] if seq_names is not None and i < len(seq_names) else chr(65 + i) if i < 26 else f"s{i}"


def slot_grid(
    ax: Axes,
    rows: int,
    block_size: int,
    face: Mapping[int, str],
    labels: Mapping[int, str] | None = None,
    new: Collection[int] = (),
    empty: str = FREE,
    top: float | None = None,
) -> None:
    """``rows`` rows of slots (row r: slots ``r * block_size`` on), going down from ``top`` (default ``rows``):
    slot s filled with ``face[s]`` (absent: ``empty``), written with ``labels[s]``, outlined when in ``new``."""
    top = rows if top is None else top
    for s in range(rows * block_size):
        (r, o), color = divmod(s, block_size), face.get(s, empty)
        ax.add_patch(Rectangle((o, top - 1 - r), 1, 1, fc=color, ec="white", lw=1.2, gid="slot"))
        if labels and s in labels:
            ax.text(o + 0.5, top - 0.5 - r, labels[s], ha="center", va="center", fontsize=SMALL, c=text_color(color))
        if s in new:  # on top of the slot: an unfilled Rectangle
            ax.add_patch(Rectangle((o + 0.08, top - r - 0.92), 0.84, 0.84, fill=False, ec="black", lw=2.5, zorder=3))


def _legend(seqs: Iterable[int], seq_names: Sequence[str] | None) -> list[Patch]:
    return [Patch(fc=owner_color(q), label=f"seq {_name(q, seq_names)}") for q in sorted(seqs)]


def draw_slot_mapping(
    slot_mapping: Sequence[int],
    token_seq: Sequence[int],
    block_size: int,
    num_blocks: int,
    token_pos: Sequence[int] | None = None,
    seq_names: Sequence[str] | None = None,
    filled: Mapping[int, int] | None = None,
    title: str | None = None,
) -> Figure:
    """Token -> slot arrows for one batch.

    slot_mapping: [num_tokens] slot of each new token (-1 = padding, written nowhere);
    token_seq: [num_tokens] index of the sequence each token belongs to (ignored for padding);
    token_pos: [num_tokens] each token's position in its sequence (for the labels, e.g. ``B3``);
    filled: slot -> sequence index of slots that already hold earlier tokens (drawn pale).
    Artists: a ``FancyArrowPatch`` per real token; a ``Rectangle`` per token, slot and block outline.
    """
    slots, num_slots, filled = [int(s) for s in slot_mapping], num_blocks * block_size, dict(filled or {})
    if len(token_seq) != len(slots):
        raise ValueError(f"token_seq has {len(token_seq)} entries, slot_mapping {len(slots)}")
    if any(s >= num_slots or s < -1 for s in slots):
        raise ValueError(f"slot ids must be -1 or in [0, {num_slots})")
    slot_x = [b * (block_size + GAP) + o for b in range(num_blocks) for o in range(block_size)]  # blocks side by side
    width = slot_x[-1] + 1
    fig, ax = new_figure(max(8.0, 0.42 * width + 1.5), 4.6)
    y_slot, y_tok, h = 0.0, 2.6, 0.8
    writer = {s: token_seq[i] for i, s in enumerate(slots) if s >= 0}
    for s, x in enumerate(slot_x):  # the pool's slots: written now in the writer's colour, earlier ones pale
        face = owner_color(writer[s]) if s in writer else owner_color(filled[s]) if s in filled else "white"
        alpha = 0.35 if s in filled and s not in writer else 1.0
        ax.add_patch(Rectangle((x + 0.05, y_slot), 0.9, h, fc=face, alpha=alpha, ec="#555555", lw=1))
        color = text_color(face) if s in writer else "black"
        ax.text(x + 0.5, y_slot + h / 2, str(s), ha="center", va="center", fontsize=SMALL + 1, color=color)
    for b in range(num_blocks):
        x0 = slot_x[b * block_size]
        ax.add_patch(Rectangle((x0 - 0.05, y_slot - 0.08), block_size + 0.1, h + 0.16, fill=False, ec="black", lw=1.8))
        ax.text(x0 + block_size / 2, y_slot - 0.3, f"block {b}", ha="center", va="top", fontsize=SMALL + 2)

    xs: list[float] = []
    x = 0.0  # the batch's tokens, packed in order, a gap between sequences (and around padding)
    for i, s in enumerate(slots):
        x += GAP * bool(i and ((s < 0) != (slots[i - 1] < 0) or s >= 0 and token_seq[i] != token_seq[i - 1]))
        xs.append(x)
        x += 1
    scale = min(1.0, width / x) if x else 1.0
    xs, tw = [(width - x * scale) / 2 + t * scale for t in xs], 0.9 * scale
    pad_runs: list[list[float]] = []  # x of the first and last padding token of each run
    for i, (s, tx) in enumerate(zip(slots, xs)):
        if s < 0:
            ax.add_patch(Rectangle((tx, y_tok), tw, h, fc=WASTE, ec="#555555", hatch="//", lw=1))
            pad_runs += [[tx, tx + tw]] if not i or slots[i - 1] >= 0 else []
            pad_runs[-1][1] = tx + tw
            continue
        color = owner_color(token_seq[i])
        ax.add_patch(Rectangle((tx, y_tok), tw, h, fc=color, ec="black", lw=1))
        label = _name(token_seq[i], seq_names) + ("" if token_pos is None else str(token_pos[i]))
        size = SMALL + 1 if scale > 0.7 else SMALL
        ax.text(tx + tw / 2, y_tok + h / 2, label, ha="center", va="center", fontsize=size, color=text_color(color))
        ends = (tx + tw / 2, y_tok - 0.02), (slot_x[s] + 0.5, y_slot + h + 0.1)
        ax.add_patch(FancyArrowPatch(*ends, arrowstyle="-|>", mutation_scale=12, color=color, lw=1.4, alpha=0.85))
    for lo, hi in pad_runs:  # one label per run of padding, not one per token
        ax.text((lo + hi) / 2, y_tok + h + 0.1, "slot -1: skipped", ha="center", va="bottom", color=MUTED, fontsize=11)
    ax.text(-0.4, y_tok + h / 2, "new\ntokens", ha="right", va="center", fontsize=12)
    ax.text(-0.4, y_slot + h / 2, "pool\nslots", ha="right", va="center", fontsize=12)
    handles = _legend({token_seq[i] for i, s in enumerate(slots) if s >= 0} | set(filled.values()), seq_names)
    handles += [Patch(fc=WASTE, hatch="//", label="padding (slot -1)")] * bool(pad_runs)
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=len(handles), frameon=False)
    ax.set(xlim=(-1.6, width + 0.2), ylim=(-0.9, y_tok + h + (0.6 if pad_runs else 0.2)))
    ax.set_axis_off()
    ax.set_title(title or f"slot = block_id * {block_size} + offset")
    return fig


def draw_pool_fill(
    frames: Sequence[tuple[str, Sequence[Sequence[int]], Sequence[int]]],
    num_blocks: int,
    block_size: int,
    seq_names: Sequence[str] | None = None,
) -> Figure:
    """Small multiples of the pool, one panel per frame (e.g. after the prefill, after each decode).

    frames: ``(label, block_tables, num_tokens)`` with ``block_tables[i]`` the physical blocks of
    sequence ``i`` and ``num_tokens[i]`` the tokens it holds. A panel is the pool as a grid (one
    row per block, one column per offset, :func:`slot_grid`); the tokens written since the previous
    frame get a thick black outline.
    """
    if not frames:
        raise ValueError("draw_pool_fill needs at least one frame")
    width = max(6.0, len(frames) * (0.38 * block_size + 1.0)) + 0.5
    fig, axes = new_grid(width, 0.38 * num_blocks + 2.2, ncols=len(frames))
    prev: dict[int, int] = {}
    for ax, (label, tables, num_tokens) in zip(axes[0], frames, strict=True):
        owner: dict[int, int] = {}  # slot -> sequence
        for i, (table, ntok) in enumerate(zip(tables, num_tokens, strict=True)):
            if ntok > len(table) * block_size:
                raise ValueError(f"sequence {i} holds {ntok} tokens but has only {len(table)} blocks")
            owner.update({table[p // block_size] * block_size + p % block_size: i for p in range(ntok)})
        new = [s for s, seq in owner.items() if prev.get(s) != seq]  # written since the previous frame
        slot_grid(ax, num_blocks, block_size, {s: owner_color(q) for s, q in owner.items()}, new=new)
        ax.set(xlim=(0, block_size), ylim=(0, num_blocks), aspect="equal", xticks=[])
        ax.set_yticks([num_blocks - 0.5 - b for b in range(num_blocks)], list(map(str, range(num_blocks))), fontsize=12)
        ax.tick_params(length=0)
        ax.spines[["left", "bottom"]].set_visible(False)
        ax.set_title(label, fontsize=12)
        prev = owner
    axes[0][0].set_ylabel("physical block")
    seqs = range(max(len(f[1]) for f in frames))
    handles = [*_legend(seqs, seq_names), Patch(fc="white", ec="black", lw=2.5, label="written this step")]
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False)
    return fig
