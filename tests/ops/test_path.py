"""``path=`` of ag_gemm and gemm_rs: the plain path (cuBLAS + a torch.distributed collective) against torch in the
emulated world, the cost model's automatic choice, forcing, and the same choice on every rank."""

from __future__ import annotations

import json
import re
import types

import pytest
import torch

import tilelink
from tests.ops.path_worlds import (
    attention_plain_matches_sdpa,
    chosen_paths,
    moe_plain_matches_torch,
    plain_gemm_ar_matches_torch,
    plain_matches_torch,
    setting_on_one_rank,
)
from tilelink import cost
from tilelink.errors import LaunchError

MLP = {"MLP-1": (4096, 11008), "MLP-4": (4608, 36864), "MLP-5": (8192, 28672), "MLP-6": (8192, 29568)}


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3])
def test_plain_path_matches_torch(world: int) -> None:
    """37 rows over 2 or 3 ranks: the last rank's shorter shard is padded to the collective's equal blocks."""
    for dtype, bound in (("float32", 1e-6), ("bfloat16", 2e-2)):
        for per_rank in tilelink.spawn(plain_matches_torch, world, 37, 20, 33, dtype):
            assert all(err < bound for err in per_rank.values()), (dtype, per_rank)


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3])
def test_plain_moe_matches_torch(world: int) -> None:
    """ag_moe and moe_rs on the plain path: 37 tokens (uneven shards), 4 experts of which one gets none, top-2,
    each rank its slice of the intermediate dim (uneven at world 3)."""
    for dtype, bound in (("float32", 1e-5), ("bfloat16", 2e-2)):
        for per_rank in tilelink.spawn(moe_plain_matches_torch, world, 37, 16, 20, 4, 2, dtype):
            assert all(err < bound for err in per_rank.values()), (dtype, per_rank)


def test_auto_for_moe() -> None:
    """Decode-sized MoE calls go to the plain path; MoE-6's moe_rs over 8 ranks to the overlapped kernels, its
    ag_moe (whose GEMM waits for the whole gather) stays plain: predicted within the margin."""
    cal = cost.load(cost.SHIPPED)
    for S in (1, 16):
        assert cost.decide("ag_moe", dict(S=S, H=4096, N=512, E=32, topk=5), 8, calibration=cal).path == "plain"
        assert cost.decide("moe_rs", dict(S=S, H=4096, K=256, E=32, topk=5), 8, calibration=cal).path == "plain"
    assert cost.decide("moe_rs", dict(S=8192, H=4096, K=256, E=32, topk=5), 8, calibration=cal).path == "overlap"
    ag = cost.decide("ag_moe", dict(S=8192, H=4096, N=512, E=32, topk=5), 8, calibration=cal)
    assert ag.path == "plain" and ag.prediction.plain * (1 - cal["choice_margin"]) <= ag.prediction.overlap


@pytest.mark.slow
def test_plain_gemm_ar_matches_torch() -> None:
    """GEMM + all-reduce's plain path, three ranks with uneven slices of K (4, 4, 2)."""
    for dtype, bound in (("float32", 1e-6), ("bfloat16", 2e-2)):
        errors = tilelink.spawn(plain_gemm_ar_matches_torch, 3, 21, 12, 10, dtype)
        assert all(err < bound for err in errors), (dtype, errors)


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3])
def test_plain_sp_attention_matches_sdpa(world: int) -> None:
    """37 rows of sequence (uneven shards), grouped-query heads, causal by global position and not."""
    for dtype, bound in (("float32", 1e-5), ("bfloat16", 2e-2)):
        for per_rank in tilelink.spawn(attention_plain_matches_sdpa, world, 2, 4, 2, 37, 16, dtype):
            assert all(err < bound for err in per_rank.values()), (dtype, per_rank)


def test_auto_for_attention() -> None:
    """A short sequence goes to SDPA + NCCL; Attn-1 at 16k over 8 ranks to the overlapped kernel; at 128k, where
    the kernel's rate against cuDNN costs more than the overlap hides, back to SDPA."""
    cal = cost.load(cost.SHIPPED)
    pick = lambda S, world=8: cost.decide("sp_attention", dict(S=S, heads=32, kv_heads=32, head_dim=128), world,
                                          calibration=cal).path
    assert (pick(64), pick(16384), pick(131072)) == ("plain", "overlap", "plain")
    causal = cost.predict("sp_attention", dict(S=16384, heads=32, kv_heads=32, head_dim=128, causal=True), 8)
    assert causal.compute < 0.6 * cost.predict("sp_attention", dict(S=16384, heads=32, kv_heads=32, head_dim=128),
                                               8).compute


@pytest.mark.parametrize("world", [2, 8])
@pytest.mark.parametrize("M", [1, 2, 4, 8, 16])
def test_auto_picks_plain_for_decode(world: int, M: int) -> None:
    cal = cost.load(cost.SHIPPED)
    for name, (H, inter) in MLP.items():
        ag = cost.decide("ag_gemm", dict(M=M, N=2 * inter // world, K=H), world, calibration=cal)
        rs = cost.decide("gemm_rs", dict(M=M, N=H, K=inter // world), world, calibration=cal)
        assert (ag.path, rs.path) == ("plain", "plain"), (name, ag.why, rs.why)
        assert ag.prediction.plain < ag.prediction.overlap


@pytest.mark.parametrize(("world", "names"), [(8, ("MLP-4", "MLP-5", "MLP-6")), (2, ("MLP-1", "MLP-5"))])
def test_auto_picks_overlap_for_large_shapes(world: int, names: tuple[str, ...]) -> None:
    cal = cost.load(cost.SHIPPED)
    for name in names:
        H, inter = MLP[name]
        for op, shape in (("ag_gemm", dict(M=8192, N=2 * inter // world, K=H)),
                          ("gemm_rs", dict(M=8192, N=H, K=inter // world))):
            choice = cost.decide(op, shape, world, calibration=cal)
            assert choice.path == "overlap", (name, op, choice.why)
            assert "predicted overlap" in choice.why and "vs plain" in choice.why


class _World:
    """A rank of a world of two as ``select`` sees it: its exchange returns every rank's value, the peers' own sizes
    from ``values`` and their settings from ``settings`` (this rank's, unless given)."""

    def __init__(self, rank: int, values: list, settings: list | None = None):
        self.rank, self.world_size, self.session = rank, len(values), f"s{rank}"
        self.device = types.SimpleNamespace(type="cuda")
        self.exchanges = 0

        def exchange(value, point):
            self.exchanges += 1
            mine = value[len(values[rank]):]
            return [value if i == rank else (*v, *(settings[i] if settings else mine)) for i, v in enumerate(values)]

        self.control = types.SimpleNamespace(exchange=exchange, prefix=f"tilelink/s{rank}/1")


def test_the_choice_is_the_same_on_every_rank_whatever_its_own_size() -> None:
    """ag_gemm's N is each rank's own: one rank with 16 columns would pick plain alone, one with 16384 overlap;
    both decide from the widest."""
    from tilelink.ops import path

    path.forget()
    shared = dict(M=2048, K=4096)
    alone = {n: cost.decide("ag_gemm", dict(shared, N=n), 2).path for n in (16, 16384)}
    assert alone == {16: "plain", 16384: "overlap"}
    picks = [path.select("ag_gemm", "auto", _World(r, [(16,), (16384,)]), shared, {"N": n}, "bf16")
             for r, n in ((0, 16), (1, 16384))]
    assert picks == ["overlap", "overlap"]
    path.forget()


def test_forced_paths_and_a_bad_path() -> None:
    from tilelink.ops import path

    w = _World(0, [(1,), (1,)])
    assert path.select("gemm_rs", "overlap", w, dict(M=1, N=4096), {"K": 4096}, "bf16") == "overlap"
    assert path.select("gemm_rs", "plain", w, dict(M=8192, N=8192), {"K": 14336}, "bf16") == "plain"
    with pytest.raises(LaunchError, match=r"gemm_rs: path='fast' is not one of 'auto', 'overlap', 'plain'"):
        path.select("gemm_rs", "fast", w, dict(M=1, N=1), {"K": 1}, "bf16")


def test_tilelink_path_replaces_auto_only(monkeypatch) -> None:
    from tilelink.ops import path

    w = _World(0, [(4096,), (4096,)])
    decode = (dict(M=1, N=4096), {"K": 4096}, "bf16")
    monkeypatch.setenv("TILELINK_PATH", "overlap")
    assert path.select("gemm_rs", "auto", w, *decode) == "overlap"
    assert path.select("gemm_rs", "plain", w, *decode) == "plain"
    monkeypatch.setenv("TILELINK_PATH", "Plain")
    assert path.select("gemm_rs", "auto", w, dict(M=8192, N=8192), {"K": 14336}, "bf16") == "plain"
    monkeypatch.setenv("TILELINK_PATH", "fastest")
    with pytest.raises(LaunchError, match="gemm_rs: TILELINK_PATH='fastest' is not one of auto, overlap, plain"):
        path.select("gemm_rs", "auto", w, *decode)


def test_a_setting_of_one_rank_alone_is_refused_on_every_rank(monkeypatch) -> None:
    """TILELINK_PATH or TILELINK_CALIBRATION set on some ranks only would send them down another path than their
    peers (the plain path's collective against the overlapped kernels: both wait forever): every rank exchanges its
    settings with its sizes, once per shared shape, and refuses a difference, naming each rank's."""
    from tilelink.ops import path

    path.forget()
    decode = (dict(M=1, N=4096), {"K": 4096}, "bf16")
    monkeypatch.setenv("TILELINK_PATH", "plain")
    w = _World(0, [(4096,), (4096,)], settings=[("plain", ""), ("", "")])
    with pytest.raises(LaunchError, match=r"gemm_rs: the ranks would choose the path from different settings "
                                          r"\(rank 0: TILELINK_PATH='plain', TILELINK_CALIBRATION=''; rank 1: "
                                          r"TILELINK_PATH='', TILELINK_CALIBRATION=''\)"):
        path.select("gemm_rs", "auto", w, *decode)
    monkeypatch.delenv("TILELINK_PATH")
    w = _World(1, [(4096,), (4096,)], settings=[("", "/a.json"), ("", "")])
    with pytest.raises(LaunchError, match="rank 0: TILELINK_PATH='', TILELINK_CALIBRATION='/a.json'"):
        path.select("gemm_rs", "auto", w, *decode)
    # alike: decided once per shared shape, forced or modelled
    monkeypatch.setenv("TILELINK_PATH", "overlap")
    w = _World(0, [(4096,), (4096,)])
    assert [path.select("gemm_rs", "auto", w, *decode) for _ in range(3)] == ["overlap"] * 3
    assert w.exchanges == 1
    path.forget()


def test_a_new_world_decides_again() -> None:
    """A choice is kept per world: after finalize() and init() the first call of a shape exchanges again on every
    rank, also on one whose new control took the memory, and so the id, of the last one (that rank alone would skip
    the exchange its peers wait in)."""
    from tilelink.ops import path

    path.forget()
    w = _World(0, [(16,), (16,)])
    decode = (dict(M=2048, K=4096), {"N": 16}, "bf16")
    assert path.select("ag_gemm", "auto", w, *decode) == "plain"
    w.control.prefix = "tilelink/s0/2"  # the next world's control, where the last one was
    assert path.select("ag_gemm", "auto", w, *decode) == "plain"
    assert w.exchanges == 2
    path.forget()


@pytest.mark.slow
def test_a_setting_of_one_rank_alone_does_not_hang_the_world() -> None:
    """Rank 0 alone with TILELINK_PATH=plain: both ranks raise at their first call, none waits in a collective."""
    for message in tilelink.spawn(setting_on_one_rank, 2):
        assert message.startswith("LaunchError: gemm_rs: the ranks would choose the path from different settings "
                                  "(rank 0: TILELINK_PATH='plain'"), message


def test_a_new_world_gets_its_own_nccl_group(monkeypatch) -> None:
    """The plain path's NCCL group is made once per world: a world after finalize() and init() (whose process
    group, and every group made from it, was destroyed) makes its own, also when its control object takes the
    memory, and so the id, of the last one, as a freed object's successor often does."""
    import torch

    from tilelink.ops import plain

    made = []
    monkeypatch.setattr(plain.dist, "get_backend", lambda group: "gloo")
    monkeypatch.setattr(plain.dist, "new_group", lambda **kwargs: made.append(kwargs) or object())
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(uuid="GPU-0"))
    control = types.SimpleNamespace(prefix="tilelink/s/1", exchange=lambda value, point: [("a", "0"), ("b", "0")])
    world = types.SimpleNamespace(session="s", control=control, group=None, ranks=(0, 1), world_size=2,
                                  device=torch.device("cuda", 0))
    first, staged = plain.group(world)
    assert not staged and len(made) == 1 and plain.group(world)[0] is first  # made once per world
    control.prefix = "tilelink/s/2"  # the next world's control, where the last one was
    again, _ = plain.group(world)
    assert len(made) == 2 and again is not first


def _tiny_overlap_calibration(tmp_path) -> str:
    """The shipped calibration with no host cost and a slow NCCL: the overlapped kernels win even at the
    emulated world's tiny shapes."""
    data = json.loads(cost.SHIPPED.read_text())
    data["parts"].update({k: 0.0 for k in data["parts"] if k.startswith(("host_ms.", "host_peer_ms."))})
    data["parts"]["nccl_all_gather_latency_us"] = data["parts"]["nccl_reduce_scatter_latency_us"] = 1e4
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.slow
def test_auto_in_the_emulated_world_follows_the_calibration(tmp_path, monkeypatch) -> None:
    """With TILELINK_CALIBRATION the emulated world models the calibration's machine: the shipped H200 one sends
    a decode-sized call to the plain path on every rank, one where the overlap wins sends it to the kernels;
    forcing overrides both. Every result matches torch."""
    monkeypatch.setenv("TILELINK_CALIBRATION", str(cost.SHIPPED))
    runs = {"shipped auto": tilelink.spawn(chosen_paths, 3, 8, 12, 10)}
    runs["shipped overlap"] = tilelink.spawn(chosen_paths, 3, 8, 12, 10, "overlap")
    monkeypatch.setenv("TILELINK_CALIBRATION", _tiny_overlap_calibration(tmp_path))
    runs["overlap wins auto"] = tilelink.spawn(chosen_paths, 3, 8, 12, 10)
    for label, per_rank in runs.items():
        for got in per_rank:
            assert all(e < 1e-5 for e in got["errors"]), (label, got)
        picks = [re.findall(r"ranks: (\w+)", " ".join(got["log"])) for got in per_rank]
        assert len(picks[0]) == 2 and all(p == picks[0] for p in picks), (label, picks)  # alike on every rank
    expect = {"shipped auto": ["ag_gemm", "gemm_rs"], "shipped overlap": [], "overlap wins auto": []}
    for label, calls in expect.items():
        assert all(got["plain_calls"] == calls for got in runs[label]), (label, runs[label])
    assert all(" plain; predicted overlap" in line for line in runs["shipped auto"][0]["log"])
    assert all("(forced)" in line for line in runs["shipped overlap"][0]["log"])
    assert all(" overlap; predicted overlap" in line for line in runs["overlap wins auto"][0]["log"])


def test_the_calibration_read_follows_the_variable(tmp_path, monkeypatch) -> None:
    """A calibration read while $TILELINK_CALIBRATION named another file is not kept once the variable changes
    (a process that set it for a while, as a test or a notebook does, would decide from it afterwards)."""
    decode = dict(M=8, K=4096, N=4096)
    monkeypatch.setenv("TILELINK_CALIBRATION", _tiny_overlap_calibration(tmp_path))
    assert cost.decide("ag_gemm", decode, 8).path == "overlap"
    monkeypatch.delenv("TILELINK_CALIBRATION")
    assert cost.decide("ag_gemm", decode, 8).path == "plain"
    assert cost.shipped().parts == cost.load(cost.SHIPPED).parts


def test_the_plain_path_on_host_copies_refuses_capture(monkeypatch) -> None:
    """Ranks sharing a GPU run the plain path's collective on gloo over host copies, which a CUDA graph cannot
    capture: a captured call says so and what to pass, instead of failing inside the collective."""

    from tilelink.ops import plain

    world = types.SimpleNamespace(group="gloo group", device=torch.device("cuda", 0), session=1,
                                  control=types.SimpleNamespace(prefix="w"))
    monkeypatch.setattr(plain.dist, "get_backend", lambda group: "gloo")
    monkeypatch.setitem(plain._nccl_groups, (1, "w"), None)  # no NCCL group: the ranks share a GPU
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert plain.group(world) == ("gloo group", True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(LaunchError, match=r"cannot be captured in a CUDA graph.*path=\"overlap\""):
        plain.group(world)
