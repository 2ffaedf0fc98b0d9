"""Tensor-parallel plans for the vision towers, applied with PyTorch's own machinery.

Every transformer block is split Megatron-style with ``parallelize_module`` on a 1-D DeviceMesh:
the projections that make attention heads (q, k, v) and the MLP's first layer(s) are
``ColwiseParallel`` (each rank computes whole heads / a slice of hidden units from the replicated
input), the attention output projection and the MLP's last layer are ``RowwiseParallel`` (partial
sums all-reduced), so every block ends replicated and so does the tower's output. Embeddings,
norms, the Qwen patch merger and heads outside the blocks stay replicated (a small share of the
compute, and it keeps the output path identical to tp=1).

Qwen's fused ``qkv`` Linear holds rows [q | k | v]; a plain column shard would give rank 0 all of
q and part of k. Its rows are permuted first so that rank r's contiguous shard is
[q heads of r | k heads of r | v heads of r], which is exactly what the unchanged attention code
reshapes as ``(seq, 3, num_heads / T, head_dim)``; ``num_heads`` is then set to the local count.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module

from encoder_pod.parallel.tensor.plans import divisibility_problems

BLOCK_LISTS = ("blocks", "layers")
"""Names of the ModuleLists holding transformer blocks (Qwen ``blocks``, CLIP/SigLIP ``encoder.layers``)."""


class NotShardable(ValueError):
    """The model's structure or sizes do not allow a split over the group (refused at start)."""


def fused_qkv_order(num_heads: int, head_dim: int, tp_size: int) -> torch.Tensor:
    """Row order of a fused [q | k | v] projection so each of ``tp_size`` column shards holds whole heads.

    Returns indices into the original ``3 * num_heads * head_dim`` rows: for rank r, the rows of
    its heads in q, then in k, then in v.
    """
    local = num_heads // tp_size
    dim = num_heads * head_dim
    order = [
        part * dim + head * head_dim + i
        for rank in range(tp_size)
        for part in range(3)
        for head in range(rank * local, (rank + 1) * local)
        for i in range(head_dim)
    ]
    return torch.tensor(order, dtype=torch.long)


def _linear(module: nn.Module, name: str) -> nn.Linear | None:
    child = getattr(module, name, None)
    return child if isinstance(child, nn.Linear) else None


def _attention_plan(block: nn.Module, tp_size: int) -> tuple[dict[str, ParallelStyle], nn.Module, int]:
    """(plan, attention module, heads) for a block's attention: fused qkv or separate q/k/v."""
    for attn_name in ("attn", "self_attn"):
        attn = getattr(block, attn_name, None)
        if attn is None:
            continue
        heads = int(attn.num_heads)
        if _linear(attn, "qkv") and _linear(attn, "proj"):
            return {f"{attn_name}.qkv": ColwiseParallel(), f"{attn_name}.proj": RowwiseParallel()}, attn, heads
        if all(_linear(attn, n) for n in ("q_proj", "k_proj", "v_proj", "out_proj")):
            plan: dict[str, ParallelStyle] = {f"{attn_name}.{n}": ColwiseParallel() for n in ("q_proj", "k_proj", "v_proj")}
            plan[f"{attn_name}.out_proj"] = RowwiseParallel()
            return plan, attn, heads
    raise NotShardable(f"no known attention layout in {type(block).__name__}")


def _mlp_plan(block: nn.Module) -> tuple[dict[str, ParallelStyle], int]:
    """(plan, hidden units) for a block's MLP: fc1/fc2 (GELU) or gate/up/down (SwiGLU)."""
    mlp = getattr(block, "mlp", None)
    if mlp is not None and (fc1 := _linear(mlp, "fc1")) and _linear(mlp, "fc2"):
        return {"mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()}, fc1.out_features
    if mlp is not None and (gate := _linear(mlp, "gate_proj")) and _linear(mlp, "up_proj") and _linear(mlp, "down_proj"):
        return (
            {"mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel()},
            gate.out_features,
        )
    raise NotShardable(f"no known MLP layout in {type(block).__name__}")


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """Every transformer block of the tower, in order."""
    blocks = [
        block
        for name, module in model.named_modules()
        if isinstance(module, nn.ModuleList) and name.rsplit(".", 1)[-1] in BLOCK_LISTS
        for block in module
    ]
    if not blocks:
        raise NotShardable(f"no transformer blocks ({' / '.join(BLOCK_LISTS)}) found in {type(model).__name__}")
    return blocks


def check_shardable(model: nn.Module, tp_size: int) -> None:
    """:class:`NotShardable` naming the sizes when a block cannot be split ``tp_size`` ways."""
    for index, block in enumerate(transformer_blocks(model)):
        _, _, heads = _attention_plan(block, tp_size)
        _, width = _mlp_plan(block)
        problems = divisibility_problems(heads, width, tp_size)
        if problems:
            raise NotShardable(f"block {index}: " + "; ".join(problems) + f" (tensor parallel size {tp_size})")


@torch.no_grad()
def _permute_fused_qkv(qkv: nn.Linear, heads: int, tp_size: int) -> None:
    order = fused_qkv_order(heads, qkv.out_features // (3 * heads), tp_size).to(qkv.weight.device)
    qkv.weight.copy_(qkv.weight[order])
    if qkv.bias is not None:
        qkv.bias.copy_(qkv.bias[order])


def shard_tower(model: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """Split every block of ``model`` over ``mesh`` in place; returns ``model``.

    Every rank must call this with the same weights, in the same order (distributing a parameter
    is a collective).
    """
    tp_size = mesh.size()
    check_shardable(model, tp_size)
    for block in transformer_blocks(model):
        attn_plan, attn, heads = _attention_plan(block, tp_size)
        mlp_plan, _ = _mlp_plan(block)
        qkv = _linear(attn, "qkv")
        if qkv is not None:
            _permute_fused_qkv(qkv, heads, tp_size)
        parallelize_module(block, mesh, {**attn_plan, **mlp_plan})
        # The attention code reshapes by num_heads (Qwen) or by head_dim with -1 heads (CLIP):
        # either way the local module now holds heads / T of them.
        setattr(attn, "num_heads", heads // tp_size)  # noqa: B010 - a plain int attribute of an HF module
    return model
