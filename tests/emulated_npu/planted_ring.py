"""Planted defects in MindSpeed's ring attention (context parallelism, `megatron_cp_algo`), for
tests/emulated_npu/test_ring_attention.py: the REAL MindSpeed source, COPIED, with one line of it rewritten. Each
plant names the line exactly, inside the one function or class where it must stand; when upstream moves or
changes that line the plant raises, so the test fails loudly instead of running an unplanted tree.

The padded cp2 row runs the GENERAL strategy (`GeneralAttentionStrategy`, mask type 'general'): its forward hands
`npu_fusion_attention` one mask per KV block (`AttentionWithCp.compute_mask`, the list the engine builds in
engines/mindspeed/megatron.py `mindspeed_cp_split`), the later block masked whole, and merges the blocks by their
softmax statistics (context_parallel/utils.py `general_out_update` -> `forward_update`). The emulated op returns
poison for the wholly masked rows, so every plant below that reads them, or weights them wrongly, shows."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

RING = "mindspeed/core/context_parallel/ring_context_parallel/ring_context_parallel.py"
UTILS = "mindspeed/core/context_parallel/utils.py"
#: what the copy holds besides mindspeed/: what the lane reads of a tree (README.md and setup.py: the pairing gate)
TREE_FILES = ("README.md", "setup.py")


@dataclasses.dataclass(frozen=True)
class Plant:
    """Rewrite the lines `old` to `new` in `path`. `old` are whole lines (compared without their indentation) that
    stand exactly once in the scope `scope` opens (that top-level line up to the next top-level `def` / `class`);
    `new` takes the indentation of `old`'s first line."""

    path: str
    scope: str
    old: tuple[str, ...]
    new: tuple[str, ...]
    why: str


PLANTS = {
    # the mask: the KV block's own mask, one block off (cp2: the diagonal block gets the later block's mask, the
    # later block the diagonal's)
    "mask_off_by_one_block": Plant(
        RING, "class AttentionWithCp(torch.autograd.Function):",
        ("return attn_mask[kv_block_id] if isinstance(attn_mask, list) else None",),
        ("return attn_mask[(kv_block_id + 1) % len(attn_mask)] if isinstance(attn_mask, list) else None",),
        "compute_mask takes the mask of the next KV block"),
    # the mask: True read as 'attend' (the convention flash-attn and SDPA use), not as 'masked' (CANN's)
    "mask_polarity": Plant(
        RING, "class AttentionWithCp(torch.autograd.Function):",
        ("return attn_mask[kv_block_id] if isinstance(attn_mask, list) else None",),
        ("return ~attn_mask[kv_block_id] if isinstance(attn_mask, list) else None",),
        "compute_mask inverts the mask"),
    # the block order: the forward never advances the KV block id, so the KV received from the previous rank is
    # taken for this rank's own (its mask, and the merge treats it as the diagonal block that starts the output).
    # With cp_window_size 1 (the default: inner ring of 1) the ring is the OUTER loop: its block id is the one
    "kv_block_id_not_advanced": Plant(
        RING, "class AttentionWithCp(torch.autograd.Function):",
        ("kv_block_id_outer = (kv_block_id_outer + cp_config.cp_size - cp_config.inner_size) % cp_config.cp_size",),
        ("kv_block_id_outer = kv_block_id_outer",),
        "the forward's KV block id stays this rank's after the ring rotates the KV"),
    # the block order, seen only where the ring has more than two blocks (cp2: -1 and +1 are the same step): the
    # forward labels the KV it receives as the NEXT rank's block where the ring hands it the previous rank's
    "ring_rotation_reversed": Plant(
        RING, "class AttentionWithCp(torch.autograd.Function):",
        ("kv_block_id_outer = (kv_block_id_outer + cp_config.cp_size - cp_config.inner_size) % cp_config.cp_size",),
        ("kv_block_id_outer = (kv_block_id_outer + cp_config.inner_size) % cp_config.cp_size",),
        "the forward's KV block id turns the other way round the ring"),
    # the merge of block outputs: each block weighted by the OTHER block's softmax statistics
    "merge_swaps_statistics": Plant(
        UTILS, "def general_out_update(q_block_id, kv_block_id, cur_attn_outs, global_attn_outs):",
        ("attn_out, softmax_max, softmax_sum,", "cur_attn_out, cur_softmax_max, cur_softmax_sum, layout=layout"),
        ("attn_out, cur_softmax_max, cur_softmax_sum,", "cur_attn_out, softmax_max, softmax_sum, layout=layout"),
        "general_out_update weights each block by the other block's statistics"),
}


def planted_text(text: str, plant: Plant) -> str:
    lines = text.splitlines(keepends=True)
    opens = [i for i, line in enumerate(lines) if line.rstrip() == plant.scope]
    assert len(opens) == 1, (f"{plant.path}: {plant.scope!r} stands {len(opens)} times at the top level (want "
                             "once): upstream moved it")
    first = opens[0]
    last = next((i for i in range(first + 1, len(lines)) if lines[i].startswith(("def ", "class "))), len(lines))
    n = len(plant.old)
    at = [i for i in range(first, last - n + 1) if [line.strip() for line in lines[i:i + n]] == list(plant.old)]
    assert len(at) == 1, (f"{plant.path}: {plant.old!r} stands {len(at)} times in {plant.scope!r} (want once): "
                          f"upstream changed the line the plant '{plant.why}' rewrites")
    indent = lines[at[0]][:len(lines[at[0]]) - len(lines[at[0]].lstrip())]
    return "".join(lines[:at[0]] + [f"{indent}{line}\n" for line in plant.new] + lines[at[0] + n:])


def copy_tree(src: Path, dest: Path, plant: str | None = None) -> Path:
    """`dest`: a copy of the MindSpeed tree `src` (mindspeed/ and the files the lane reads), with `plant` applied;
    None: the unplanted copy, the clean twin."""
    shutil.copytree(src / "mindspeed", dest / "mindspeed", ignore=shutil.ignore_patterns("__pycache__"))
    for name in TREE_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dest / name)
    if plant is not None:
        spec = PLANTS[plant]
        path = dest / spec.path
        path.write_text(planted_text(path.read_text(), spec))
    return dest
