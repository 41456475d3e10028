"""Reduce-scatter producers that store through a tensor descriptor: each channel must receive exactly
its rows times the stored columns, whatever the shape of the offsets, and the tile-order rotation must
never move a store away from the tile it computed. Each case is generated, then run once in the
interpreter against a local barrier array (rank 0 of a small world)."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest
import torch
import triton

import tilelink
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import AnnotationError
from tilelink.mapping import RowSharding

HEAD = """
import triton
import triton.language as tl
import tilelink

"""


def _build(tmp_path: Path, name: str, body: str):
    src = HEAD + textwrap.dedent(body)
    path = tmp_path / f"{name}.py"
    path.write_text(src)
    gen = generate(src, str(path), requests_in(src, str(path)))
    out = tmp_path / f"{name}_tilelink.py"
    out.write_text(gen.text)
    spec = importlib.util.spec_from_file_location(f"descriptor_case_{name}", out)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, gen


def _channels(M: int, world: int, C: int) -> tuple[RowSharding, dict]:
    sh = RowSharding(M, world, C)
    return sh, dict(tlk_epoch=1, tlk_rank=0, tlk_world=world, tlk_rows=M, tlk_rows_per_rank=sh.rows_per_rank,
                    tlk_rows_per_channel=sh.rows_per_channel, tlk_channels_per_rank=C,
                    tlk_diag=torch.zeros(8, dtype=torch.int64), tlk_budget=10**9)


def _expected(sh: RowSharding, row_elems: int) -> torch.Tensor:
    return torch.tensor([sh.channel_rows(c) * row_elems for c in range(sh.num_channels)])


def _fills_with_ones(module, grid, M: int, N: int, world: int, C: int, **meta) -> None:
    """Run kernel ``k`` (it stores 1 into every element of an (M, N) tensor) as rank 0 of ``world`` ranks of
    ``C`` channels each: every element is written and every channel gets exactly its rows times N."""
    sh, chan = _channels(M, world, C)
    barriers = torch.zeros(sh.num_channels, dtype=torch.int64)
    c = torch.zeros(M, N)
    module.k[grid](c, M, N, tlk_barriers=barriers, **meta, **chan)
    assert (c == 1).all()
    assert torch.equal(barriers, _expected(sh, N)), barriers


@pytest.mark.parametrize("half", [False, True])
def test_block_height_given_by_an_expression(tmp_path: Path, half: bool) -> None:
    """``block_shape=[BM // 2 if HALF else BM, ...]``: the tile end must be ``start + (that)``."""
    module, gen = _build(tmp_path, "ifexp", """
        @tilelink.overlap(tilelink.reduce_scatter("c_ptr", dim=0))
        @triton.jit
        def k(c_ptr, M, N, BM: tl.constexpr, BLOCK_N: tl.constexpr, HALF: tl.constexpr):
            pid = tl.program_id(0)
            pid_n = tl.program_id(1)
            c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1],
                                               block_shape=[BM // 2 if HALF else BM, BLOCK_N])
            c_desc.store([pid * (BM // 2 if HALF else BM), pid_n * BLOCK_N],
                         tl.full((BM // 2 if HALF else BM, BLOCK_N), 1.0, tl.float32))
        """)
    assert "+ (BM // 2 if HALF else BM)" in gen.rewritten["k"]
    M, N = 64, 8
    sh, chan = _channels(M, 2, 2)
    barriers = torch.zeros(sh.num_channels, dtype=torch.int64)
    c = torch.zeros(M, N)
    module.k[(triton.cdiv(M, 8 if half else 16), 1)](c, M, N, BM=16, BLOCK_N=8, HALF=half, tlk_barriers=barriers,
                                                     **chan)
    assert (c == 1).all()
    assert torch.equal(barriers, _expected(sh, N)), barriers


def test_column_offsets_below_zero_count_only_the_columns_inside(tmp_path: Path) -> None:
    """Right-aligned column tiles: the first box starts left of column 0, and stores only its part inside."""
    module, _ = _build(tmp_path, "negative", """
        @tilelink.overlap(tilelink.reduce_scatter("c_ptr", dim=0))
        @triton.jit
        def k(c_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
            pid = tl.program_id(0)
            pid_n = tl.program_id(1)
            c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
            c_desc.store([pid * BM, N - (tl.cdiv(N, BN) - pid_n) * BN], tl.full((BM, BN), 1.0, tl.float32))
        """)
    _fills_with_ones(module, (2, 2), 32, 12, 2, 1, BM=16, BN=8)


def test_pid_recomputed_for_the_epilogue_is_rotated_at_both(tmp_path: Path) -> None:
    """A persistent kernel that recomputes ``pid_m`` for its store (``tile_id_c``, as Triton's tutorial
    does): rotating only one of the two assignments would store a tile at another tile's rows; both are
    rotated, and the product stays right on rank 0 of two."""
    module, gen = _build(tmp_path, "recomputed", """
        @triton.jit
        def _pid(tile_id, num_pid_n):
            return tile_id // num_pid_n, tile_id % num_pid_n


        @tilelink.overlap(tilelink.reduce_scatter("c_ptr", dim=0))
        @triton.jit
        def k(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
              NUM_SMS: tl.constexpr):
            start_pid = tl.program_id(0)
            num_pid_n = tl.cdiv(N, BN)
            a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
            b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
            c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
            tile_id_c = start_pid - NUM_SMS
            for tile_id in tl.range(start_pid, tl.cdiv(M, BM) * num_pid_n, NUM_SMS):
                pid_m, pid_n = _pid(tile_id, num_pid_n)
                acc = tl.zeros((BM, BN), dtype=tl.float32)
                for ki in range(0, tl.cdiv(K, BK)):
                    acc = tl.dot(a_desc.load([pid_m * BM, ki * BK]), b_desc.load([ki * BK, pid_n * BN]), acc)
                tile_id_c += NUM_SMS
                pid_m, pid_n = _pid(tile_id_c, num_pid_n)
                c_desc.store([pid_m * BM, pid_n * BN], acc)
        """)
    assert gen.rewritten["k"].count("pid_m = tlm.tl_remap_tile(") == 2
    assert "pid_m rotated after lines" in str(gen.report)
    M, N, K = 64, 32, 32
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8))
    sh, chan = _channels(M, 2, 2)
    barriers = torch.zeros(sh.num_channels, dtype=torch.int64)
    c = torch.zeros(M, N)
    module.k[(3,)](a, b, c, M, N, K, BM=16, BN=16, BK=16, NUM_SMS=3, tlk_barriers=barriers, **chan)
    assert (c - a @ b).abs().max().item() < 1e-4
    assert torch.equal(barriers, _expected(sh, N)), barriers


def test_pid_updated_from_itself_is_not_rotated(tmp_path: Path) -> None:
    """``pid_m`` assigned twice, once from its own value: rotating both values would rotate the second
    twice, so the tile order is left alone and the report says why."""
    _, gen = _build(tmp_path, "self_updated", """
        @tilelink.overlap(tilelink.reduce_scatter("c_ptr", dim=0))
        @triton.jit
        def k(c_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
            pid_m = tl.program_id(0)
            pid_m = pid_m % tl.cdiv(M, BM)
            rows = pid_m * BM + tl.arange(0, BM)
            cols = tl.arange(0, BN)
            tl.store(c_ptr + rows[:, None] * N + cols[None, :], tl.zeros((BM, BN), dtype=tl.float32) + 1.0,
                     mask=(rows[:, None] < M) & (cols[None, :] < N))
        """)
    assert "tl_remap_tile" not in gen.rewritten["k"]
    assert "pid_m (assigned at line(s)" in str(gen.report)
    assert "is also updated from its own value" in str(gen.report)


ADVANCED = """
        @tilelink.overlap(tilelink.reduce_scatter("c_ptr", dim=0))
        @triton.jit
        def k(c_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr, NUM_SMS: tl.constexpr):
            pid_m = tl.program_id(0)
            for _ in range(0, tl.cdiv(tl.cdiv(M, BM), NUM_SMS)):
                rows = pid_m * BM + tl.arange(0, BM)
                cols = tl.arange(0, BN)
                tl.store(c_ptr + rows[:, None] * N + cols[None, :], tl.zeros((BM, BN), dtype=tl.float32) + 1.0,
                         mask=(rows[:, None] < M) & (cols[None, :] < N))
                {update}
        """


def test_pid_advanced_through_another_variable_is_refused_at_the_store(tmp_path: Path) -> None:
    """A persistent loop that advances ``pid_m`` through another variable (``nxt = pid_m + NUM_SMS``, ``pid_m =
    nxt``): TileLink cannot write the tile's rows out over the loop's steps, so the launch could not check that no
    two programs store the same rows; the store is refused, saying what to write."""
    with pytest.raises(AnnotationError, match="writes the rows from `pid_m \\* BM`, which TileLink cannot write out"):
        _build(tmp_path, "advanced_through",
               ADVANCED.format(update="nxt = pid_m + NUM_SMS\n                pid_m = nxt"))


def test_pid_augmented_is_not_rotated(tmp_path: Path) -> None:
    """A persistent loop that advances ``pid_m`` from its own value by ``+=`` (with a single ``=`` assignment):
    rotating would rotate the advanced value again and leave rows unwritten, so the order is left alone, and every
    channel still completes. The launch reads the tile's rows as ``pid + step * NUM_SMS``."""
    update = "pid_m += NUM_SMS"
    module, gen = _build(tmp_path, "advanced", ADVANCED.format(update=update))
    (row, *_), = gen.plans[0].launch.stored_tiles
    assert row.replace(" ", "").startswith("((tl.program_id(0))+") and row.endswith(") * BM"), row
    assert "tl_remap_tile" not in gen.rewritten["k"]
    assert "is also updated from its own value" in str(gen.report)
    _fills_with_ones(module, (2,), 64, 8, 4, 1, BM=8, BN=8, NUM_SMS=2)


def test_pid_indexing_tiles_of_two_heights_is_not_rotated(tmp_path: Path) -> None:
    """``pid_m`` reused for tiles of BM rows, then of BM // 2 rows: one rotation cannot fit both, so the
    order is left alone and every row and channel is still covered. (The two loops run in two programs, on the two
    sides of an ``if``: two tile loops of one program may store the same rows, which TileLink cannot tell apart.)"""
    module, gen = _build(tmp_path, "two_heights", """
        @tilelink.overlap(tilelink.reduce_scatter("c_ptr", dim=0, size="M"))
        @triton.jit
        def k(c_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
            HALF: tl.constexpr = BM // 2
            cols = tl.arange(0, BN)
            if tl.program_id(0) == 0:
                for t in range(0, tl.cdiv(M // 2, BM)):
                    pid_m = t
                    rows = pid_m * BM + tl.arange(0, BM)
                    tl.store(c_ptr + rows[:, None] * N + cols[None, :], tl.zeros((BM, BN), dtype=tl.float32) + 1.0,
                             mask=(rows[:, None] < M // 2) & (cols[None, :] < N))
            else:
                for t in range(0, tl.cdiv(M - M // 2, HALF)):
                    pid_m = t
                    rows2 = M // 2 + pid_m * HALF + tl.arange(0, HALF)
                    tl.store(c_ptr + rows2[:, None] * N + cols[None, :], tl.zeros((HALF, BN), dtype=tl.float32) + 1.0,
                             mask=(rows2[:, None] < M) & (cols[None, :] < N))
        """)
    assert "tl_remap_tile" not in gen.rewritten["k"]
    _fills_with_ones(module, (2,), 60, 8, 4, 1, BM=8, BN=8)


def test_two_stores_in_nested_tile_loops_hold_their_adds_apart(tmp_path: Path) -> None:
    """A tile loop with a store, holding an inner loop with another store: each store's held adds are
    loop variables of its own (the inner loop's are flushed after it, on every outer iteration), so
    neither clears nor resends the other's; every channel gets exactly its rows. (The two stores write the two
    column halves of one tile: two stores of one program must write disjoint columns.)"""
    module, gen = _build(tmp_path, "nested", """
        @tilelink.overlap(tilelink.reduce_scatter("c_ptr", dim=0))
        @triton.jit
        def k(c_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
            cols = tl.arange(0, BN)
            cols2 = BN + cols
            for t in range(0, tl.cdiv(M, BM)):
                rows = t * BM + tl.arange(0, BM)
                tl.store(c_ptr + rows[:, None] * N + cols[None, :], tl.zeros((BM, BN), dtype=tl.float32) + 1.0,
                         mask=(rows[:, None] < M) & (cols[None, :] < N))
                for u in range(0, 1):
                    rows2 = t * BM + u * BM + tl.arange(0, BM)
                    tl.store(c_ptr + rows2[:, None] * N + cols2[None, :],
                             tl.zeros((BM, BN), dtype=tl.float32) + 1.0,
                             mask=(rows2[:, None] < M) & (cols2[None, :] < N))
        """)
    body = gen.rewritten["k"]
    outer, inner = body.index("for t in range("), body.index("for u in range(")
    assert outer < body.index("tlk_pending_1 = tll.no_pending_tiles()") < inner  # the inner store's, per t
    assert body.index("tlk_pending_0 = tll.no_pending_tiles()") < outer
    assert inner < body.index("tll.producer_tile_notify_flush(tlk_barriers, tlk_pending_1)") < body.index(
        "tll.producer_tile_notify_flush(tlk_barriers, tlk_pending_0)")
    _fills_with_ones(module, (1,), 64, 8, 2, 2, BM=8, BN=4)
    _fills_with_ones(module, (1,), 60, 5, 3, 2, BM=8, BN=4)


def test_grouped_notify_compiles_with_a_64_bit_tile_start(tmp_path: Path) -> None:
    """The pending adds are carried with fixed types whatever the tile start's: a 64-bit ``pid_m`` in a
    persistent loop compiles for sm_90 (a loop-carried variable may not change type)."""
    import os
    import subprocess
    import sys

    _, gen = _build(tmp_path, "wide_start", """
        @tilelink.overlap(tilelink.reduce_scatter("c_ptr", dim=0))
        @triton.jit
        def k(c_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr, NUM_SMS: tl.constexpr):
            for tile_id in tl.range(tl.program_id(0), tl.cdiv(M, BM), NUM_SMS):
                pid_m = tile_id.to(tl.int64)
                rows = pid_m * BM + tl.arange(0, BM)
                cols = tl.arange(0, BN)
                tl.store(c_ptr + rows[:, None] * N + cols[None, :], tl.zeros((BM, BN), dtype=tl.float32) + 1.0,
                         mask=(rows[:, None] < M) & (cols[None, :] < N))
        """)
    assert "tll.producer_tile_notify_rows_grouped(" in gen.rewritten["k"]
    assert "producer_tile_notify_rows_grouped after the store at line" in str(gen.report)
    script = tmp_path / "compile_wide.py"
    script.write_text(textwrap.dedent(f"""
        import importlib.util
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        spec = importlib.util.spec_from_file_location("wide", {str(tmp_path / "wide_start_tilelink.py")!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        k = module.k
        const = dict(BM=16, BN=16, NUM_SMS=4)
        sig = {{n: "constexpr" if n in const else {{"c_ptr": "*fp32", "tlk_barriers": "*i64", "tlk_diag": "*i64",
                                                   "tlk_budget": "i64"}}.get(n, "i32") for n in k.arg_names}}
        triton.compile(ASTSource(k, sig, const), target=GPUTarget("cuda", 90, 32))
        print("compiled")
        """))
    env = {key: v for key, v in os.environ.items() if key != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "compiled" in result.stdout, result.stdout + result.stderr[-3000:]


@pytest.mark.parametrize("theirs", ['["n"]', '("n",)', "NAMES"])
def test_a_kernels_own_do_not_specialize_is_kept(tmp_path: Path, theirs: str) -> None:
    """``@triton.jit(do_not_specialize=...)`` on the annotated kernel: the rewritten kernel's decorator keeps
    the kernel's own entries (a literal list or tuple, or a name: unpacked) and adds the channel scalars."""
    module, gen = _build(tmp_path, "own_dns", f"""
        NAMES = ["n"]

        @tilelink.overlap(tilelink.reduce_scatter("c_ptr", dim=0))
        @triton.jit(do_not_specialize={theirs})
        def k(c_ptr, M, N, n, BM: tl.constexpr, BN: tl.constexpr):
            rows = tl.program_id(0) * BM + tl.arange(0, BM)
            cols = tl.arange(0, BN)
            tl.store(c_ptr + rows[:, None] * N + cols[None, :], tl.zeros((BM, BN), dtype=tl.float32) + n,
                     mask=(rows[:, None] < M) & (cols[None, :] < N))
        """)
    text = gen.text
    decorator = text[text.index("@triton.jit(do_not_specialize=["):text.index("def k(")]
    assert ('"n"' in decorator) != (theirs == "NAMES") and ("*NAMES" in decorator) == (theirs == "NAMES")
    assert '"tlk_epoch"' in decorator
    listed = eval(decorator[len("@triton.jit(do_not_specialize="):decorator.rindex(")")], vars(module))  # noqa: S307
    assert listed[0] == "n" and listed.count("n") == 1 and "tlk_epoch" in listed and "M" not in listed, listed


def test_two_tile_loops_hold_their_adds_apart(tmp_path: Path) -> None:
    """Two tile loops that each store tiles by descriptor (the first tiles on the even programs, the last on the
    odd ones, on the two sides of an ``if``): each loop holds its own adds (a variable of its own, nothing held
    before it, flushed after it), so the second loop neither clears nor resends the first one's, and every channel
    gets exactly its rows times N. Without the ``if`` (a persistent kernel's body and a second loop over its last
    tiles, in one program) the stores of the two loops are refused: TileLink cannot tell that the two loops store
    other tiles."""
    source = """
        @tilelink.overlap(tilelink.reduce_scatter("c_ptr", dim=0))
        @triton.jit
        def k(c_ptr, M, N, SPLIT, BM: tl.constexpr, BN: tl.constexpr, PROGRAMS: tl.constexpr):
            pid = tl.program_id(0)
            num_n = tl.cdiv(N, BN)
            tiles = tl.cdiv(M, BM) * num_n
            c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
            if pid % 2 == 0:
                for tile in tl.range(pid // 2, SPLIT, PROGRAMS // 2):
                    pid_m = tile // num_n
                    pid_n = tile % num_n
                    c_desc.store([pid_m * BM, pid_n * BN], tl.full((BM, BN), 1.0, tl.float32))
            else:
                for tile in range(SPLIT + pid // 2, tiles, PROGRAMS // 2):
                    pid_m = tile // num_n
                    pid_n = tile % num_n
                    c_desc.store([pid_m * BM, pid_n * BN], tl.full((BM, BN), 1.0, tl.float32))
        """
    one_program = source.replace("            if pid % 2 == 0:\n", "").replace("            else:\n", "").replace(
        "pid // 2", "pid").replace("PROGRAMS // 2", "PROGRAMS").replace("\n                ", "\n            ")
    with pytest.raises(AnnotationError, match="may both write the same elements in one program"):
        _build(tmp_path, "two_loops_one_program", one_program)
    module, gen = _build(tmp_path, "two_loops", source)
    body = gen.rewritten["k"]
    for i in (0, 1):
        assert body.count(f"tlk_pending_{i} = tll.no_pending_tiles()") == 1
        assert body.count(f"tll.producer_tile_notify_flush(tlk_barriers, tlk_pending_{i})") == 1
        assert body.count(f"tlk_pending_{i} = tll.producer_tile_notify_rows_grouped(") == 1
    loops = [body.index("for tile in tl.range("), body.index("for tile in range(")]
    flushes = [body.index(f"tll.producer_tile_notify_flush(tlk_barriers, tlk_pending_{i})") for i in (0, 1)]
    assert loops[0] < flushes[0] < loops[1] < flushes[1]
    assert str(gen.report).count("notifies four tiles at a time") == 2
    # 7 x 3 tiles on 4 programs: the first loop takes 9 of them on programs 0 and 2 (4 or 5 each: a group of four
    # and a flushed rest), the second the other 12 on programs 1 and 3; the last row tile and column tile are partial
    M, N, BM, BN = 100, 40, 16, 16
    _fills_with_ones(module, (4,), M, N, 2, 3, SPLIT=9, BM=BM, BN=BN, PROGRAMS=4)


def test_a_conditional_block_width_is_checked_as_a_whole(tmp_path: Path) -> None:
    """The compile-time check that two descriptor stores write disjoint columns takes a block width written as a
    conditional expression whole: pasted into `a - b >= 0` without parentheses, `BLOCK_N if not SUB else BLOCK_N // 2`
    would have made the check `(a - BLOCK_N) if not SUB else (BLOCK_N // 2 >= 0)`, true for every subtiled launch."""
    module, gen = _build(tmp_path, "conditional_width", '''
        @tilelink.overlap(tilelink.reduce_scatter("c_ptr", dim=0))
        @triton.jit
        def k(c_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SUB: tl.constexpr):
            c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1],
                                               block_shape=[BLOCK_M, BLOCK_N if not SUB else BLOCK_N // 2])
            offs_m = tl.program_id(0) * BLOCK_M
            offs_n = tl.program_id(1) * BLOCK_N
            half = tl.full((BLOCK_M, BLOCK_N // 2), 1.0, tl.float32)
            if SUB:
                c_desc.store([offs_m, offs_n + BLOCK_N // 4], half)
                c_desc.store([offs_m, offs_n], half)
            else:
                c_desc.store([offs_m, offs_n], tl.full((BLOCK_M, BLOCK_N), 1.0, tl.float32))
    ''')
    asserts = [line.strip() for line in gen.text.splitlines() if line.strip().startswith("tl.static_assert(")]
    assert asserts, gen.text
    check = asserts[0][len("tl.static_assert("):].split(", ", 1)[0]
    assert "(BLOCK_N if not SUB else BLOCK_N // 2)" in check, check
    # the stores overlap when subtiled (a quarter apart, half a block wide): the check fails for every width
    for block_n in (16, 32, 64):
        assert eval(check, {"BLOCK_N": block_n, "SUB": True}) is False, check  # noqa: S307 - generated arithmetic
    sh, chan = _channels(16, 2, 1)
    with pytest.raises(Exception, match="overlapping columns"):
        module.k[(1, 1)](torch.zeros(16, 16), 16, 16, BLOCK_M=8, BLOCK_N=16, SUB=True,
                         tlk_barriers=torch.zeros(sh.num_channels, dtype=torch.int64), **chan)


#: the tutorials' persistent GEMM epilogue: the output descriptor's block as wide as the tile, or half as wide with
#: the tile stored in two halves (`EPILOGUE_SUBTILE`), its width a conditional expression of the constexpr flag
SUBTILED = '''
@tilelink.overlap(tilelink.reduce_scatter("c_ptr", dim=0))
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SUB: tl.constexpr):
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, stride_cn],
                                       block_shape=[BLOCK_M, BLOCK_N if not SUB else BLOCK_N // 2])
    pid = tl.program_id(0)
    pid_m = pid // tl.cdiv(N, BLOCK_N)
    pid_n = pid % tl.cdiv(N, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + (k * BLOCK_K + offs_k)[None, :] * stride_ak,
                    mask=(offs_m[:, None] < M) & ((k * BLOCK_K + offs_k)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k * BLOCK_K + offs_k)[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=((k * BLOCK_K + offs_k)[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    if SUB:
        halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
        left, right = tl.split(halves)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], left)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N + BLOCK_N // 2], right)
    else:
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc)
'''


def _subtiled(path: str, sub: bool) -> float:
    from tests.rules import cases

    kernel = cases.module_at(path).matmul_kernel
    return cases._rs_gemm(kernel, tilelink.rank(), tilelink.world_size(), M=48, N=32, K=40, BLOCK_M=16,
                          BLOCK_N=16, BLOCK_K=16, SUB=sub)


@pytest.mark.parametrize("sub", [False, True])
def test_a_block_width_chosen_by_a_constexpr_flag_launches(tmp_path: Path, sub: bool, monkeypatch) -> None:
    """The launch checks that no two programs store the same elements by evaluating each store's tile over the grid;
    a block width written `BLOCK_N if not SUB else BLOCK_N // 2` takes the side its flag picks for the launch."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "subtiled.py"
    path.write_text(HEAD + textwrap.dedent(SUBTILED))
    errors = tilelink.spawn(_subtiled, 2, str(path), sub)
    assert all(e < 1e-4 for e in errors), errors
