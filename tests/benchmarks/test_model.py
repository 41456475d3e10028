"""The cost model (``tilelink.cost``): its shipped calibration is what the records give, its predictions against
the measured two-GPU runs, its pipelines, and the plumbing of ``tlxform bench model --calibrate`` (tiny sizes on
the CPU, and fake measurements for what needs GPUs)."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from tilelink import cost
from tilelink.benchmarks import model


def test_the_shipped_calibration_is_the_records() -> None:
    """cost_h200.json is reproducible from docs/perf: rebuilt, every part and source is the same."""
    built = model.calibration_from_records()
    shipped = cost.load(cost.SHIPPED)
    assert set(built.parts) == set(cost.PARTS) == set(shipped.parts)
    for name, value in built.parts.items():
        assert math.isclose(value, shipped.parts[name], rel_tol=1e-6), name
    assert built.sources == shipped.sources
    assert shipped.machine["device"] == "NVIDIA H200" and shipped.machine["records"]


def test_predictions_against_every_measured_two_gpu_run() -> None:
    rows = model.validation_rows(cost.load(cost.SHIPPED))
    assert {(r["op"], r["world"]) for r in rows} == {(op, 2) for op in ("ag_gemm", "gemm_rs", "ag_moe", "moe_rs")}
    assert len(rows) == 28
    errors = [abs(r[k]) for r in rows for k in ("plain_err", "overlap_err")]
    assert sorted(errors)[len(errors) // 2] < 0.05
    # the MLP runs are GPU-bound and steady: every one within 10%
    assert all(abs(r[k]) <= 0.10 for r in rows if r["op"] in ("ag_gemm", "gemm_rs")
               for k in ("plain_err", "overlap_err")), model.validation_table(rows)
    table = model.validation_table(rows)
    assert table.count("\n") == len(rows) + 1 and "| MLP-1 | ag_gemm | 1 (2026-11-30) |" in table


def test_pipelines() -> None:
    # compute-bound: the copies hide under the compute; copy-bound: one shard's compute after the last copy
    assert cost.gather_pipeline(4, c=1.0, s=0.1) == pytest.approx(4.0)
    assert cost.gather_pipeline(4, c=0.1, s=1.0) == pytest.approx(3.1)
    assert cost.gather_pipeline(1, c=2.0, s=9.0) == 2.0
    assert cost.scatter_pipeline(3, c=1.0, s=0.5) == pytest.approx(3.0)
    assert cost.scatter_pipeline(3, c=0.1, s=1.0) == pytest.approx(2.1)  # 0.1 + two copies in a row


def test_the_link_and_the_world_move_the_communication() -> None:
    cal = cost.load(cost.SHIPPED)
    shape = dict(M=8192, N=4096, K=4096)
    base = cost.predict("ag_gemm", shape, 8, calibration=cal)
    slow = cost.predict("ag_gemm", shape, 8, calibration=cal, link=cost.Link(gb_s=cal["copy_engine_gb_s"] / 4))
    assert slow.comm > 2.5 * base.comm and slow.compute == base.compute and slow.overlap_gpu > base.overlap_gpu
    late = cost.predict("ag_gemm", shape, 8, calibration=cal, link=cost.Link(latency_us=1000.0))
    assert late.comm == pytest.approx(base.comm + 0.998)  # NCCL pays it once a call
    assert late.overlap_gpu > base.overlap_gpu + 7 * 0.99  # the copy engine once a peer
    one = cost.predict("gemm_rs", shape, 1, calibration=cal)
    assert one.comm == 0 and one.host_overlap == 0 and one.ideal == one.compute
    for op, names in ((k, v[0]) for k, v in cost.OPERATORS.items()):
        p = cost.predict(op, {n: 1024 if n not in ("E", "topk") else 2 for n in names}, 4, calibration=cal)
        assert 0 < p.ideal <= p.plain and p.overlap > 0, op


def test_bad_arguments_say_what_to_do(tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown operator 'ag_gemv'.*ag_gemm"):
        cost.predict("ag_gemm".replace("mm", "mv"), {}, 2)
    with pytest.raises(ValueError, match="gemm_rs: shape lacks K"):
        cost.predict("gemm_rs", dict(M=1, N=2), 2)
    broken = tmp_path / "c.json"
    broken.write_text(json.dumps({"machine": {}, "parts": {"gemm_tflops": 1}}))
    with pytest.raises(ValueError, match=r"missing parts .*recalibrate"):
        cost.load(broken)
    broken.write_text("{")
    with pytest.raises(ValueError, match=r"c.json:1: not JSON"):
        cost.load(broken)


GEMMS = ((64, 64, 64), (128, 64, 32), (64, 128, 128))


def _cpu_env() -> dict:
    """Tiny sizes on the CPU; the timer runs each measured function and answers the time a machine of 500 TFLOP/s
    (4000 GB/s epilogue), 1000 GB/s memory, 5 us launches and 250 TFLOP/s attention would take."""
    import torch

    answers = [2 * M * N * K / 500e9 + M * N * 4 / 4000e6 for M, N, K in GEMMS]
    answers += [2 * (1 << 16) / 1000e6, 200 * 5e-3, 4 * 16 * 32 * 2 * 128 / 250e9]

    def timer(fn):
        fn()
        return answers.pop(0)

    return {"device": "cpu", "dtype": torch.float32, "timer": timer, "gemm_shapes": GEMMS, "copy_bytes": 1 << 16,
            "attention_shape": (16, 32, 2), "operator_gemm": (32, 32, 32), "nccl_bytes": (1024,)}


def test_calibrate_measures_replaces_and_keeps() -> None:
    """The CPU runs the real GEMM, memory, launch and attention measurements on tiny sizes; the GPU-only ones are
    faked: one returns a part, one fails, one returns a non-number. Measured parts say so; the rest keep the
    base's values and sources."""
    base = cost.load(cost.SHIPPED)
    lines = []

    def failing(env):
        raise RuntimeError("no peer here")

    fakes = {name: model.MEASUREMENTS[name] for name in ("gemm", "memory", "launch", "attention")}
    fakes |= {"peers": lambda env: {"copy_engine_gb_s": 321.0}, "nccl": failing,
              "operators": lambda env: {"tile_ratio.ag_gemm": float("nan")}}
    cal = model.calibrate(base, _cpu_env(), fakes, echo=lines.append)
    measured = {"gemm_tflops", "gemm_epilogue_gb_s", "hbm_gb_s", "kernel_launch_us", "attention_tflops",
                "copy_engine_gb_s"}
    assert set(cal.machine["measured"]) == measured
    expect = {"gemm_tflops": 500, "gemm_epilogue_gb_s": 4000, "hbm_gb_s": 1000, "kernel_launch_us": 5,
              "attention_tflops": 250, "copy_engine_gb_s": 321}
    assert {k: pytest.approx(v, rel=1e-4) for k, v in expect.items()} == {k: cal.parts[k] for k in expect}
    for name in measured:
        assert "--calibrate" in cal.sources[name]
    for name in set(cost.PARTS) - measured:
        assert cal.parts[name] == base.parts[name] and cal.sources[name] == base.sources[name], name
    assert any(line.startswith("nccl: not measured (RuntimeError: no peer here)") for line in lines)
    assert any("tile_ratio.ag_gemm = nan is not a positive number" in line for line in lines)
    assert cal.machine["device"] == "cpu"
    with pytest.raises(KeyError, match="'gemm_flops', which is not a part"):
        model.calibrate(base, _cpu_env(), {"typo": lambda env: {"gemm_flops": 1.0}}, echo=lines.append)


def test_fits_recover_their_parameters() -> None:
    samples = [(M, N, K, 2 * M * N * K / 500e9 + M * N * 2 / 4000e6) for M, N, K in model.GEMM_SHAPES]
    rate, epilogue = model.fit_gemm(samples)
    assert rate == pytest.approx(500) and epilogue == pytest.approx(4000)
    ring = [(R, b, 20e-3 + (R - 1) * b / 300e6) for R in (2, 4) for b in (1e6, 3e7)]
    assert model.fit_collective(ring) == pytest.approx((300, 20))


def test_the_host_time_per_peer() -> None:
    """What each rank past two adds to a call's host time: the slope through world 2's median, never negative,
    and nothing without a world of two and a larger one."""
    slope, source = model.fit_host_per_peer({2: [0.2, 0.1, 0.3], 4: [0.3], 8: [0.5, 0.4, 0.6]})
    assert slope == pytest.approx((2 * 0.1 + 6 * 0.3) / (2**2 + 6**2)) and "worlds 2, 4, 8" in source
    assert model.fit_host_per_peer({2: [0.3], 4: [0.2]})[0] == 0.0
    assert model.fit_host_per_peer({2: [0.3]}) == (0.0, "no host record of more than two ranks")
    assert model.fit_host_per_peer({1: [0.05], 2: [0.3]}) == (0.0, "no host record of more than two ranks")
    assert model.fit_host_per_peer({4: [0.3], 8: [0.5]}) == (0.0, "no host record of two ranks")
    cal = cost.load(cost.SHIPPED)
    parts = {**cal.parts, "host_ms.gemm_rs": 5.0, "host_peer_ms.gemm_rs": 0.5}
    steep = cost.Calibration(cal.machine, parts, cal.sources)
    shape = dict(M=64, N=64, K=64)  # device time far below the host's: the host sets the pace
    for R, host in ((1, 0.0), (2, 5.0), (4, 6.0), (8, 8.0)):
        p = cost.predict("gemm_rs", shape, R, calibration=steep)
        assert p.host_overlap == pytest.approx(host) and p.host_plain == (cal["host_ms.plain"] if R > 1 else 0)
        assert p.overlap == pytest.approx(max(host, p.overlap_gpu))


def test_host_records_set_the_host_times(tmp_path) -> None:
    """A host-benchmark record's world-2 medians replace the dist records' host times, its larger worlds give the
    time per peer, which the MoE operators take from the launcher they share; a calibration file without the
    per-peer parts still loads (0 each)."""
    import shutil

    folder = tmp_path / "perf"
    shutil.copytree(model.RECORDS, folder, ignore=lambda d, names: [n for n in names if "host" in n])

    def world(R, ag, rs, plain=None, matmul=20.0):
        def part(us, collective):
            host = {"tilelink": us, "torch.matmul": [matmul]}
            return {"host_us": host | ({f"torch.matmul+{collective}": plain} if plain else {})}

        return {"world": R, "ranks": [{"parts": {"ag_gemm": part(ag, "all_gather"),
                                                 "gemm_rs": part(rs, "reduce_scatter")}} for _ in range(R)]}

    # an earlier run on a slower host: its plain path (world 1) at 3.25x its torch.matmul
    earlier = {"benchmark": "host", "worlds": [world(1, [50.0], [40.0], plain=[60.0, 70.0]),
                                               world(2, [900.0], [900.0])]}
    record = {"benchmark": "host", "worlds": [world(R, ag, rs, matmul=10.0) for R, ag, rs in
                                              ((2, [200.0, 220.0], [150.0]), (4, [260.0], [350.0]))]}
    wrong = world(4, [1.0] * 9, [350.0])["ranks"][0]
    wrong["parts"]["ag_gemm"]["errors"] = {"tilelink": "relative error 0.5 against the fp32 reference"}
    record["worlds"][1]["ranks"].append(wrong)  # a rank whose ag_gemm was wrong: its times are left out
    emulated = {"benchmark": "host", "device": "cpu", "worlds": [world(2, [5.0], [5.0])]}  # a smoke test's
    for day, rec in ((1, earlier), (2, record), (3, emulated)):
        (folder / f"2030-01-0{day}-host.json").write_text(json.dumps(rec))
    cal = model.calibration_from_records(folder)
    # the operators from the latest record alone (another run, another host speed); the plain path from the earlier
    # one's world 1, as a multiple of torch.matmul there, times torch.matmul in the latest
    assert cal["host_ms.ag_gemm"] == pytest.approx(0.21) and cal["host_ms.gemm_rs"] == pytest.approx(0.15)
    assert cal["host_ms.plain"] == pytest.approx(3.25 * 0.010) and "(3.25x)" in cal.sources["host_ms.plain"]
    assert cal["host_peer_ms.ag_gemm"] == pytest.approx(0.025) and cal["host_peer_ms.gemm_rs"] == pytest.approx(0.1)
    assert cal["host_peer_ms.moe_rs"] == cal["host_peer_ms.gemm_rs"]
    assert "gemm_rs's" in cal.sources["host_peer_ms.moe_rs"]
    assert cal["host_ms.sp_attention"] == cal["host_ms.ag_gemm"]
    # no host record of MoE: its base host time stays the dist records'
    assert cal["host_ms.ag_moe"] == model.calibration_from_records().parts["host_ms.ag_moe"]
    assert "dist measurements" in cal.sources["host_ms.ag_moe"]
    assert {"2030-01-01-host.json", "2030-01-02-host.json"} <= set(cal.machine["records"])
    assert "2030-01-03-host.json" not in cal.machine["records"]
    # later runs that time no operator with peers leave the operators' times as they were: one of world 1 alone
    # (its plain path is the latest: 2x its torch.matmul), one whose every operator failed
    alone = {"benchmark": "host", "worlds": [world(1, [30.0], [30.0], plain=[40.0], matmul=20.0)]}
    failed = {"benchmark": "host", "worlds": [world(2, [1.0], [1.0])]}
    for rank in failed["worlds"][0]["ranks"]:
        for got in rank["parts"].values():
            got["errors"] = {"tilelink": "relative error 0.5 against the fp32 reference"}
        del rank["parts"]["ag_gemm"]["host_us"]["torch.matmul"]
    for day, rec in ((4, alone), (5, failed)):
        (folder / f"2030-01-0{day}-host.json").write_text(json.dumps(rec))
    later = model.calibration_from_records(folder)
    assert later["host_ms.ag_gemm"] == pytest.approx(0.21) and later["host_peer_ms.gemm_rs"] == pytest.approx(0.1)
    assert later["host_ms.plain"] == pytest.approx(2.0 * 0.010) and "2030-01-04-host.json" in later.sources[
        "host_ms.plain"]
    older = tmp_path / "older.json"
    data = cal.to_json()
    data["parts"] = {k: v for k, v in data["parts"].items() if not k.startswith("host_peer_ms.")}
    older.write_text(json.dumps(data))
    loaded = cost.load(older)
    assert loaded["host_peer_ms.gemm_rs"] == 0.0 and loaded.sources["host_peer_ms.gemm_rs"] == "not in this file: 0"


def test_the_command(tmp_path, monkeypatch) -> None:
    from tilelink.cli.main import main

    runner = CliRunner()
    got = runner.invoke(main, ["bench", "model", "--validate"])
    assert got.exit_code == 0, got.output
    assert "| MoE-6 | moe_rs |" in got.output and "predicted times within 10%" in got.output
    got = runner.invoke(main, ["bench", "model", "--op", "gemm_rs", "--shape", "M=8,N=4096,K=7168", "-w", "2"])
    assert got.exit_code == 0 and "auto picks    plain" in got.output, got.output
    got = runner.invoke(main, ["bench", "model", "--op", "gemm_rs", "--shape", "M=8,N=4096"])
    assert got.exit_code != 0 and "shape lacks K" in got.output
    got = runner.invoke(main, ["bench", "model", "-w", "8"])
    assert got.exit_code == 0 and "| Attn-2 128k | sp_attention |" in got.output and "gemm_tflops" in got.output
    monkeypatch.setattr(model, "MEASUREMENTS", {"peers": lambda env: {"copy_engine_gb_s": 123.0}})
    monkeypatch.setattr(model, "default_env", _cpu_env)
    out = tmp_path / "mine.json"
    got = runner.invoke(main, ["bench", "model", "--calibrate", "--out", str(out)])
    assert got.exit_code == 0, got.output
    assert cost.load(out).parts["copy_engine_gb_s"] == 123.0
    got = runner.invoke(main, ["bench", "model", "--from-records", "--out", str(tmp_path / "r.json")])
    assert got.exit_code == 0 and cost.load(tmp_path / "r.json").parts == cost.load(cost.SHIPPED).parts
