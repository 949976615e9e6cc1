"""Pictures of paged KV memory: the block pool (stage 1) and block tables (stage 2).

Both functions accept the package's objects (``BlockPool``, ``BlockTable``) or plain data
(lists and dicts, as in the engine's ``StepSnapshot``), and return a ``Figure`` without showing
it. Patches carry a ``gid`` (``"block"``, ``"logical"``, ``"slot"``, ``"table"``, ``"physical"``,
``"arrow"``) so tests can count them.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence

from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

from minipaged.viz.memory import owner_colors
from minipaged.viz.style import FONT_SIZE, FREE, SHARED_EDGE, new_figure

IN_USE = "#9E9E9E"  # a block in use whose owner the caller did not name
CACHED_HATCH = ".."


def _text_color(fill: str) -> str:
    r, g, b = to_rgb(fill)
    return "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black"


def owners_from_tables(block_tables: Mapping[Hashable, Sequence[int]]) -> dict[int, list[Hashable]]:
    """block id -> the owners whose tables hold it (several for a shared block), in table order.

    ``block_tables`` maps an owner to its block ids (a list, or a ``BlockTable``).
    """
    owners: dict[int, list[Hashable]] = {}
    for owner, table in block_tables.items():
        for block_id in getattr(table, "block_ids", table):
            if owner not in owners.setdefault(int(block_id), []):
                owners[int(block_id)].append(owner)
    return owners


def _pool_state(pool_or_state):
    """(ref_cnt, cached, free_order, block_tables) from a BlockPool, a snapshot, a dict or a list."""
    s = pool_or_state
    if hasattr(s, "blocks") and hasattr(s, "free_queue"):  # BlockPool
        return ([b.ref_cnt for b in s.blocks], [b.block_hash is not None for b in s.blocks],
                [b.block_id for b in s.free_queue], None)
    if isinstance(s, Mapping):
        return list(s["ref_cnt"]), list(s.get("cached") or []), s.get("free_order"), s.get("block_tables")
    if hasattr(s, "ref_cnt"):  # StepSnapshot-like
        return list(s.ref_cnt), list(getattr(s, "cached", []) or []), None, getattr(s, "block_tables", None)
    if isinstance(s, int):
        return [0] * s, [], None, None
    return [int(r) for r in s], [], None, None


def draw_pool(
    pool_or_state,
    owners: Mapping[int, Hashable | Sequence[Hashable]] | None = None,
    ncols: int | None = None,
    title: str | None = None,
    cached: Sequence[bool] | None = None,
    free_order: Sequence[int] | None = None,
    show_free_order: bool = True,
) -> Figure:
    """The physical pool as a grid of blocks, coloured by owner, with each block's ``ref_cnt``.

    ``pool_or_state``: a :class:`~minipaged.kv.allocator.BlockPool`, a ``StepSnapshot``-like object
    or dict (``ref_cnt``, optional ``cached`` and ``block_tables``), a list of ref counts, or a
    number of blocks (all free). ``owners``: block id -> owner, or a list of owners for a shared
    block (see :func:`owners_from_tables`); by default a snapshot's ``block_tables`` name them.

    Each cell shows its block id (top left) and, when in use, its ``ref_cnt`` (centre, or bottom
    right under the owner's name when owners are known). Shared blocks (``ref_cnt > 1``) get a
    thick outline and a ``×n``; free blocks are light grey, with
    their place in the free queue (``q0`` is handed out next) when it is known; cached blocks
    (stage 6) are dotted.
    """
    ref_cnt, snap_cached, snap_free_order, snap_tables = _pool_state(pool_or_state)
    num_blocks = len(ref_cnt)
    if num_blocks == 0:
        raise ValueError("nothing to draw: the pool has no blocks")
    cached = list(cached) if cached is not None else snap_cached
    free_order = free_order if free_order is not None else snap_free_order
    if owners is None and snap_tables:
        owners = owners_from_tables(snap_tables)
    owners = {} if owners is None else owners
    owner_lists = {int(b): (list(o) if isinstance(o, (list, tuple)) else [o]) for b, o in owners.items()}
    all_owners = [o for b in sorted(owner_lists) for o in owner_lists[b]]
    colors = owner_colors(all_owners)
    queue_pos = {b: i for i, b in enumerate(free_order)} if (free_order is not None and show_free_order) else {}

    ncols = ncols or min(num_blocks, 16)
    nrows = math.ceil(num_blocks / ncols)
    fig, ax = new_figure(max(6.0, 0.8 * ncols + 3.2), 0.8 * nrows + 1.4)
    for block_id, rc in enumerate(ref_cnt):
        row, col = divmod(block_id, ncols)
        x, y = col, nrows - 1 - row
        block_owners = owner_lists.get(block_id, [])
        fill = colors[block_owners[0]] if (block_owners and rc > 0) else (IN_USE if rc > 0 else FREE)
        shared = rc > 1
        is_cached = block_id < len(cached) and cached[block_id]
        ax.add_patch(Rectangle((x + 0.05, y + 0.05), 0.9, 0.9, facecolor=fill,
                               edgecolor=SHARED_EDGE if shared else "#444444", lw=4 if shared else 1,
                               hatch=CACHED_HATCH if is_cached else None, gid="block"))
        ink = _text_color(fill)
        ax.text(x + 0.12, y + 0.88, str(block_id), ha="left", va="top", fontsize=FONT_SIZE - 5, color=ink)
        if rc > 0:
            count = f"×{rc}" if shared else str(rc)
            weight = "bold" if shared else "normal"
            if block_owners:  # owner in the middle, ref_cnt in the corner
                name = ",".join(str(o) for o in block_owners)
                ax.text(x + 0.5, y + 0.5, name if len(name) <= 5 else name[:4] + "…", ha="center", va="center",
                        fontsize=FONT_SIZE - 3, color=ink)
                ax.text(x + 0.88, y + 0.1, count, ha="right", va="bottom", fontsize=FONT_SIZE - 4,
                        fontweight=weight, color=ink)
            else:
                ax.text(x + 0.5, y + 0.42, count, ha="center", va="center", fontsize=FONT_SIZE,
                        fontweight=weight, color=ink)
        elif block_id in queue_pos:
            ax.text(x + 0.88, y + 0.12, f"q{queue_pos[block_id]}", ha="right", va="bottom",
                    fontsize=FONT_SIZE - 6, color="#555555")
    ax.set_xlim(0, ncols)
    ax.set_ylim(0, nrows)
    ax.set_aspect("equal")
    ax.axis("off")
    used = sum(1 for rc in ref_cnt if rc > 0)
    summary = f"{num_blocks} blocks: {used} in use, {num_blocks - used} free"
    ax.set_title(f"{title}\n{summary}" if title else summary, loc="left")
    try:
        legend_owners = sorted(colors)
    except TypeError:  # owners of mixed types
        legend_owners = list(colors)
    handles = [Patch(facecolor=colors[o], edgecolor="#444444", label=str(o)) for o in legend_owners[:10]]
    if len(colors) > 10:
        handles.append(Patch(facecolor="white", edgecolor="white", label=f"... {len(colors) - 10} more"))
    handles.append(Patch(facecolor=FREE, edgecolor="#444444", label="free"))
    if any(rc > 1 for rc in ref_cnt):
        handles.append(Patch(facecolor="white", edgecolor=SHARED_EDGE, lw=3, label="shared (ref_cnt>1)"))
    if any(cached):
        handles.append(Patch(facecolor=FREE, edgecolor="#444444", hatch=CACHED_HATCH, label="cached"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    return fig


def _tables_of(tables: Mapping, block_size: int, num_tokens: Mapping | None) -> dict[Hashable, tuple[list[int], int]]:
    """name -> (block ids, tokens) from BlockTables, (ids, tokens) pairs, or id lists + ``num_tokens``."""
    out = {}
    for name, t in tables.items():
        if hasattr(t, "block_ids") and hasattr(t, "num_tokens"):
            ids, n = list(t.block_ids), int(t.num_tokens)
        elif isinstance(t, tuple) and len(t) == 2 and not isinstance(t[0], int):
            ids, n = list(t[0]), int(t[1])
        else:
            ids = list(t)
            n = int(num_tokens[name]) if num_tokens and name in num_tokens else len(ids) * block_size
        if n > len(ids) * block_size:
            raise ValueError(f"{name!r}: {n} tokens do not fit in {len(ids)} blocks of {block_size}")
        out[name] = ([int(b) for b in ids], n)
    return out


def draw_block_tables(
    tables: Mapping,
    block_size: int,
    num_blocks: int,
    num_tokens: Mapping[Hashable, int] | None = None,
    ref_cnt: Sequence[int] | None = None,
    ncols: int | None = None,
    title: str | None = None,
) -> Figure:
    """Logical blocks -> block table -> physical blocks, one arrow per logical block.

    ``tables``: name -> a :class:`~minipaged.kv.block_table.BlockTable`, a ``(block_ids,
    num_tokens)`` pair, or a list of block ids whose token count comes from ``num_tokens``
    (as in ``StepSnapshot.block_tables`` / ``.num_tokens``; default: every block full).

    Left, each sequence's logical blocks cut into ``block_size`` slots, the filled ones coloured;
    middle, its block table (the physical id of each logical block); right, the pool of
    ``num_blocks`` physical blocks (``ncols`` columns) with the same slots filled. A block in
    several tables (or with ``ref_cnt > 1``) is shared: thick outline. ``ref_cnt`` (optional,
    per physical block) greys out blocks in use by no table drawn.
    """
    seqs = _tables_of(tables, block_size, num_tokens)
    logical_rows = sum(max(1, len(ids)) for ids, _ in seqs.values()) + 0.6 * max(0, len(seqs) - 1)
    # One column of physical blocks while it is not much taller than the logical side: arrows
    # to a second column would cross the first.
    ncols = ncols or max(1, math.ceil(num_blocks / max(24, logical_rows)))
    pool_rows = math.ceil(num_blocks / ncols)
    colors = owner_colors(list(seqs))
    draw_slots = block_size <= 64

    # Physical view: which sequences use each block and how many of its slots hold tokens.
    users: dict[int, list[Hashable]] = {}
    filled: dict[int, int] = {}
    for name, (ids, n) in seqs.items():
        for j, b in enumerate(ids):
            if not 0 <= b < num_blocks:
                raise ValueError(f"{name!r} maps logical block {j} to block {b}, outside the pool of {num_blocks}")
            users.setdefault(b, []).append(name)
            filled[b] = max(filled.get(b, 0), min(block_size, max(0, n - j * block_size)))

    # Geometry (data units): logical blocks at x 0..LW, table cells at TX, pool from PX.
    LW, TX, TW = 4.0, 5.4, 1.1
    PX, PW, PGAP = 8.6, 2.6, 1.0
    height = max(logical_rows, pool_rows)
    width = PX + ncols * (PW + PGAP)
    fig, ax = new_figure(min(22.0, max(10.0, 0.75 * width)), 0.55 * height + 1.8)

    def slot_cells(x0: float, y0: float, w: float, n_filled: int, color: str) -> None:
        if draw_slots:
            sw = w / block_size
            for s in range(block_size):
                ax.add_patch(Rectangle((x0 + s * sw, y0), sw, 0.7, facecolor=color if s < n_filled else "white",
                                       edgecolor="#BBBBBB", lw=0.4, gid="slot"))
        elif n_filled:
            ax.add_patch(Rectangle((x0, y0), w * n_filled / block_size, 0.7, facecolor=color, lw=0, gid="slot"))

    # Pool, top-down, column-major so that ncols=1 is a plain column.
    pool_top = height - (height - pool_rows) / 2
    pool_xy = {}
    for b in range(num_blocks):
        col, row = divmod(b, pool_rows)
        x, y = PX + col * (PW + PGAP), pool_top - row - 0.85
        pool_xy[b] = (x, y)
        who = users.get(b, [])
        rc = ref_cnt[b] if ref_cnt is not None and b < len(ref_cnt) else len(who)
        if who:
            slot_cells(x, y, PW, filled[b], colors[who[0]])
        elif rc > 0:
            ax.add_patch(Rectangle((x, y), PW, 0.7, facecolor=IN_USE, lw=0, gid="slot"))
        shared = len(who) > 1 or rc > 1
        ax.add_patch(Rectangle((x, y), PW, 0.7, fill=False, edgecolor=SHARED_EDGE if shared else "#444444",
                               lw=3.5 if shared else 1.2, gid="physical"))
        ax.text(x - 0.1, y + 0.35, str(b), ha="right", va="center", fontsize=FONT_SIZE - 3,
                fontweight="bold" if who else "normal", color="black" if (who or rc) else "#888888")

    # Sequences, top-down.
    y = height - (height - logical_rows) / 2
    for name, (ids, n) in seqs.items():
        color = colors[name]
        if not ids:
            y -= 1
            ax.text(LW / 2, y + 0.5, f"{name}: no blocks yet", ha="center", va="center", fontsize=FONT_SIZE - 2)
        for j, b in enumerate(ids):
            y -= 1
            yb = y + 0.15
            slot_cells(0, yb, LW, min(block_size, max(0, n - j * block_size)), color)
            ax.add_patch(Rectangle((0, yb), LW, 0.7, fill=False, edgecolor="#444444", lw=1.2, gid="logical"))
            ax.text(-0.15, yb + 0.35, f"{name} #{j}", ha="right", va="center", fontsize=FONT_SIZE - 2)
            ax.add_patch(Rectangle((TX, yb), TW, 0.7, facecolor="white", edgecolor=color, lw=2, gid="table"))
            ax.text(TX + TW / 2, yb + 0.35, str(b), ha="center", va="center", fontsize=FONT_SIZE - 1)
            ax.add_patch(FancyArrowPatch((LW + 0.1, yb + 0.35), (TX - 0.05, yb + 0.35), arrowstyle="-|>",
                                         mutation_scale=12, color="#666666", lw=1))
            px, py = pool_xy[b]
            ax.add_patch(FancyArrowPatch((TX + TW + 0.05, yb + 0.35), (px - 0.55, py + 0.35), arrowstyle="-|>",
                                         mutation_scale=16, color=color, lw=1.8, gid="arrow"))
        y -= 0.6

    for x, label in ((LW / 2, "logical blocks"), (TX + TW / 2, "block table"),
                     (PX + (ncols * (PW + PGAP) - PGAP) / 2, "physical blocks")):
        ax.text(x, height + 0.25, label, ha="center", va="bottom", fontsize=FONT_SIZE - 1, fontweight="bold")
    ax.set_xlim(-1.6, width)
    ax.set_ylim(-0.2, height + 1.0)
    ax.axis("off")
    tokens = ", ".join(f"{name}: {n} tokens" for name, (_, n) in seqs.items())
    head = title or f"block size {block_size}"
    ax.set_title(f"{head}\n{tokens}" if tokens else head, loc="left")
    handles = [Patch(facecolor=colors[n], edgecolor="#444444", label=str(n)) for n in list(colors)[:10]]
    if any(len(u) > 1 for u in users.values()) or (ref_cnt is not None and any(r > 1 for r in ref_cnt)):
        handles.append(Patch(facecolor="white", edgecolor=SHARED_EDGE, lw=3, label="shared"))
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1), frameon=False)
    return fig
