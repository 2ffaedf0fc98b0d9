"""Tensor parallel's pure parts: the split check, the fused-qkv row order, the header, placement."""

from __future__ import annotations

import msgpack
import pytest
import torch

from encoder_pod.parallel.placement import plan
from encoder_pod.parallel.tensor.plans import check_divisible, split_sizes
from encoder_pod.parallel.tensor.sharding import fused_qkv_order
from encoder_pod.parallel.tensor.messages import WIRE_VERSION, Header, Op, TensorMeta, WireError
from encoder_pod.profiling import ProfileOptions
from encoder_pod.settings import ModelSettings, ParallelSettings, SettingsError

QWEN = {"model_type": "qwen2_vl_vision", "num_heads": 16, "embed_dim": 1280, "mlp_ratio": 4}
QWEN25 = {"model_type": "qwen2_5_vl_vision", "num_heads": 16, "intermediate_size": 3420}
CLIP = {"model_type": "clip_vision_model", "num_attention_heads": 12, "intermediate_size": 3072}


def test_split_sizes_read_heads_and_mlp_width_per_family():
    assert split_sizes(QWEN) == (16, 5120)
    assert split_sizes(QWEN25) == (16, 3420)
    assert split_sizes(CLIP) == (12, 3072)


@pytest.mark.parametrize("config,tp", [(QWEN, 2), (QWEN, 8), (QWEN25, 2), (CLIP, 4), (CLIP, 1)])
def test_divisible_sizes_pass(config, tp):
    check_divisible(config, tp)


def test_heads_that_do_not_divide_are_refused_naming_the_numbers():
    with pytest.raises(SettingsError, match=r"ENCODER_TP_SIZE.*: 5;.*16 attention heads do not divide by 5"):
        check_divisible(QWEN, 5)


def test_mlp_width_that_does_not_divide_is_refused():
    # Qwen2.5-VL-7B's real intermediate size (3420) splits 2 and 4 ways, not 8.
    with pytest.raises(SettingsError, match="MLP hidden size 3420 does not divide by 8"):
        check_divisible(QWEN25, 8)


def test_a_model_without_a_plan_is_refused_by_type():
    with pytest.raises(SettingsError, match="not model_type 'whisper'"):
        check_divisible({"model_type": "whisper"}, 2)


def test_fused_qkv_order_gives_each_rank_whole_heads_of_q_k_and_v():
    heads, head_dim, tp = 4, 2, 2
    dim = heads * head_dim
    # Row i of the original projection is labelled by (part, head).
    labels = [(row // dim, (row % dim) // head_dim) for row in range(3 * dim)]
    order = fused_qkv_order(heads, head_dim, tp).tolist()
    assert sorted(order) == list(range(3 * dim))
    shard = len(order) // tp
    for rank in range(tp):
        got = [labels[i] for i in order[rank * shard : (rank + 1) * shard]]
        local = range(rank * heads // tp, (rank + 1) * heads // tp)
        # What the attention reshapes as (seq, 3, heads/T, head_dim): q then k then v, same heads.
        assert got == [(part, h) for part in range(3) for h in local for _ in range(head_dim)]


def test_fused_qkv_order_is_identity_for_one_rank():
    assert torch.equal(fused_qkv_order(4, 3, 1), torch.arange(36))


def test_header_round_trips():
    header = Header(Op.FORWARD, 7, (TensorMeta("pixel_values", "float32", (12, 1176)),), [[4], [4, 16]])
    assert Header.decode(header.encode()) == header
    assert Header.decode(Header(Op.KEEPALIVE, 8).encode()).op is Op.KEEPALIVE


def _fields(header: Header, **changes) -> bytes:
    fields = msgpack.unpackb(header.encode(), raw=False)
    return msgpack.packb({**fields, **changes}, use_bin_type=True)


def test_profile_headers_round_trip():
    opts = ProfileOptions("/tmp/p/rank-0", ("CPU",), with_stack=True, record_shapes=True, num_steps=3)
    start = Header(Op.PROFILE_START, 9, profile=opts)
    decoded = Header.decode(start.encode())
    assert decoded == start and decoded.op is Op.PROFILE_START and decoded.profile == opts
    stop = Header.decode(Header(Op.PROFILE_STOP, 10).encode())
    assert stop.op is Op.PROFILE_STOP and stop.profile is None and stop.tensors == ()
    # Defaults survive too (no num_steps: until PROFILE_STOP).
    assert Header.decode(Header(Op.PROFILE_START, 1, profile=ProfileOptions()).encode()).profile == ProfileOptions()


def test_profile_options_name_each_rank_dir_without_num_steps():
    opts = ProfileOptions.parse({"output_dir": "/x/rank-0", "activities": ["cpu"], "num_steps": 2})
    assert opts.activities == ("CPU",) and opts.num_steps == 2
    assert opts.under("tp-rank-1") == ProfileOptions("/x/rank-0/tp-rank-1", ("CPU",))


@pytest.mark.parametrize(
    "data",
    [
        b"\xc1",
        b"\x80",
        _fields(Header(Op.STOP, 1), v=WIRE_VERSION + 1),
        _fields(Header(Op.STOP, 1), op=99),  # an op this install does not know: fail loudly
        _fields(Header(Op.PROFILE_START, 1, profile=ProfileOptions())).replace(b"profile", b"pr0file"),
        _fields(Header(Op.PROFILE_START, 1), profile=None),  # start without options
        _fields(Header(Op.PROFILE_STOP, 1), profile={"output_dir": "/x"}),  # options on another op
        _fields(Header(Op.PROFILE_START, 1, profile=ProfileOptions()), profile={"activities": ["TPU"]}),
        _fields(Header(Op.PROFILE_START, 1, profile=ProfileOptions()), profile={"num_steps": 0}),
        _fields(Header(Op.KEEPALIVE, 1), tensors=[["x", "float32", [2]]]),  # tensors only on FORWARD
    ],
)
def test_malformed_headers_are_refused(data):
    with pytest.raises(WireError):
        Header.decode(data)


def test_a_header_naming_an_unsupported_dtype_is_refused():
    with pytest.raises(WireError, match="unsupported"):
        Header.decode(Header(Op.FORWARD, 1, (TensorMeta("x", "complex64", (2,)),)).encode())


def test_placement_gives_each_group_tp_gpus_and_a_share_of_cpus():
    placements = plan(ParallelSettings(dp_size=2, tp_size=2), ModelSettings(device="auto"), {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, cpus=16)
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in placements] == ["0,1", "2,3"]
    assert [p.num_threads for p in placements] == [4, 4]
    cpu = plan(ParallelSettings(dp_size=1, tp_size=2), ModelSettings(device="cpu"), {}, cpus=2)
    assert cpu[0].num_threads == 1 and cpu[0].env["CUDA_VISIBLE_DEVICES"] == ""


def test_placement_refuses_too_few_gpus_for_the_groups():
    with pytest.raises(SettingsError, match="2 groups of 2 tensor-parallel ranks need 4 GPUs, 3 visible"):
        plan(ParallelSettings(dp_size=2, tp_size=2), ModelSettings(device="cuda"), {"CUDA_VISIBLE_DEVICES": "0,1,2"}, cpus=8)
