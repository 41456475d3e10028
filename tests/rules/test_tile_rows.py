"""tile=(lo, len) is checked against what the loads of the gathered tensor read: a load whose rows may leave
[lo, lo + len) (shifted past the tile, masked by a bound past its end, through a descriptor that starts or ends
elsewhere) is refused at the load, saying which rows it reads; the chunked forms whose rows stay in the tile build
and equal torch on the race-exposing schedule."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import triton

import tilelink
from tests.rules.cases import rows_of
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import AnnotationError
from tilelink.runtime import current_world

ROOT = Path(__file__).resolve().parents[2]
FORMS = Path(__file__).parent / "forms"
POINTER = FORMS / "chunked_rows_pointer.py"
DESCRIPTOR = FORMS / "chunked_rows_descriptor.py"
ATTENTION = ROOT / "ops" / "attention_kernels.py"


def _refused(path: Path, old: str, new: str, *more: tuple[str, str]) -> AnnotationError:
    text = path.read_text()
    for was, now in ((old, new), *more):
        assert was in text, was
        text = text.replace(was, now)
    with pytest.raises(AnnotationError) as info:
        generate(text, str(path), requests_in(text, str(path)))
    return info.value


def _line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


# -- quick: what is refused, and where


def test_the_chunked_forms_and_the_attention_kernel_build() -> None:
    for path in (POINTER, DESCRIPTOR, ATTENTION):
        text = path.read_text()
        generated = generate(text, str(path), requests_in(text, str(path)))
        assert all("tll.consumer_tile_wait(" in body for body in generated.rewritten.values()), path


def test_a_pointer_load_shifted_past_the_tile_is_refused() -> None:
    err = _refused(POINTER, "offs_s[:, None] * stride_xs", "(offs_s + CHUNK)[:, None] * stride_xs")
    assert (err.line, err.column) == (_line_of(POINTER, "x = tl.load("), 17), err
    assert ("this load of 'x_ptr' reads, along dim 1, rows [CHUNK + start, CHUNK + start + BLOCK_S), masked by "
            "`offs_s[:, None] < s_hi`, and its mask does not keep them below the tile's end; tile=('s_lo', "
            "'s_hi - s_lo') states rows [s_lo, s_lo + s_hi - s_lo), the only rows its wait covers") in str(err), err
    assert "the mask `offs[:, None] < lo + len`" in err.hint, err.hint


def test_a_pointer_load_shifted_by_a_term_of_its_base_is_refused() -> None:
    # the shift is in the pointer's base, not in the offsets vector: it moves the rows all the same
    err = _refused(POINTER, "x_ptr + b * stride_xb", "x_ptr + BLOCK_S * stride_xs + b * stride_xb")
    assert "reads, along dim 1, rows [BLOCK_S + start, BLOCK_S + start + BLOCK_S)" in str(err), err


@pytest.mark.parametrize("bound", ["S", "s_hi + BLOCK_S", "s_lo + CHUNK"])
def test_a_pointer_load_masked_past_the_tile_is_refused(bound: str) -> None:
    err = _refused(POINTER, "offs_s[:, None] < s_hi", f"offs_s[:, None] < {bound}")
    assert err.line == _line_of(POINTER, "x = tl.load("), err
    assert f"reads, along dim 1, rows [start, start + BLOCK_S), masked by `offs_s[:, None] < {bound}`" in str(err), err


def test_a_pointer_load_without_the_chunk_mask_is_refused() -> None:
    err = _refused(POINTER, "mask=(offs_s[:, None] < s_hi) & (offs_d[None, :] < D)", "mask=offs_d[None, :] < D")
    assert ("reads, along dim 1, rows [start, start + BLOCK_S), which may run past the tile's end (no mask on its rows "
            "bounds them by it)") in str(err), err


def test_a_pointer_load_starting_before_the_tile_is_refused() -> None:
    err = _refused(POINTER, "range(s_lo, s_hi, BLOCK_S)", "range(s_lo - BLOCK_S, s_hi, BLOCK_S)")
    assert ("reads, along dim 1, rows [start, start + BLOCK_S), masked by `offs_s[:, None] < s_hi`, which may start "
            "before the tile") in str(err), err


def test_a_chunk_loop_over_the_builtin_range_with_a_keyword_step_is_refused() -> None:
    # compiled Triton reads the builtin `range`'s arguments by position only: `step=BLOCK_S` is dropped (a step of 1)
    err = _refused(POINTER, "range(s_lo, s_hi, BLOCK_S)", "range(s_lo, s_hi, step=BLOCK_S)")
    assert "which may start before the tile" in str(err), err


@pytest.mark.parametrize("step", ["-BLOCK_S", "step=-BLOCK_S"])
def test_a_chunk_loop_counting_down_is_refused(step: str) -> None:
    # from the chunk's end down past its start: with CHUNK not a multiple of BLOCK_S the last block starts before the
    # chunk, whether the step is given by position or by keyword
    err = _refused(POINTER, "range(s_lo, s_hi, BLOCK_S)", f"tl.range(s_lo + CHUNK, s_lo - BLOCK_S, {step})")
    assert "which may start before the tile" in str(err), err


def test_a_descriptor_shifted_past_the_tile_is_refused() -> None:
    err = _refused(DESCRIPTOR, "x_ptr + b * stride_xb + s_lo * stride_xs", "x_ptr + b * stride_xb + (s_lo + CHUNK) "
                   "* stride_xs")
    assert (err.line, err.column) == (_line_of(DESCRIPTOR, "x = desc.load("), 17), err
    assert ("this load of 'x_ptr' reads, along dim 1, rows [CHUNK + start, CHUNK + start + BLOCK_S) of the "
            "descriptor's rows [CHUNK + s_lo, CHUNK + s_hi), which may run past the tile's end") in str(err), err
    assert "tl.make_tensor_descriptor(base + lo * stride, shape=[len, ...]" in err.hint, err.hint


def test_a_descriptor_longer_than_the_tile_is_refused() -> None:
    err = _refused(DESCRIPTOR, "shape=[s_hi - s_lo, D]", "shape=[s_hi - s_lo + BLOCK_S, D]")
    assert ("reads, along dim 1, rows [start, start + BLOCK_S) of the descriptor's rows [s_lo, BLOCK_S + s_hi), which "
            "may run past the tile's end") in str(err), err


def test_a_descriptor_loaded_before_its_first_row_is_refused() -> None:
    # a read at a negative offset is clipped to the descriptor (zeros), so a descriptor over the tile stays in it; one
    # made a block early is not
    err = _refused(DESCRIPTOR, "x_ptr + b * stride_xb + s_lo * stride_xs", "x_ptr + b * stride_xb + (s_lo - BLOCK_S) "
                   "* stride_xs")
    assert "which may start before the tile" in str(err), err


def test_the_attention_kernel_with_its_descriptors_a_chunk_late_is_refused() -> None:
    err = _refused(ATTENTION, "k_base + kv_lo * stride_kn", "k_base + (kv_lo + KV_CHUNK) * stride_kn")
    assert (err.line, err.column) == (_line_of(ATTENTION, "k = chunk_k.load("), 21), err
    assert ("this load of 'k_ptr' reads, along dim 2, rows [KV_CHUNK + start_n, KV_CHUNK + start_n + BLOCK_N) of "
            "the descriptor's rows [KV_CHUNK + kv_lo, KV_CHUNK + kv_hi), which may run past the tile's end; "
            "tile=('kv_lo', 'KV_CHUNK') states rows [kv_lo, kv_lo + KV_CHUNK)") in str(err), err
    # a descriptor to the end of K/V read a block past the chunk's own blocks (one that ends at the chunk reads zeros
    # there, and one read at the chunk's own blocks stays in it)
    err = _refused(ATTENTION, "v_base + kv_lo * stride_vn, shape=[kv_hi - kv_lo, ", "v_base + kv_lo * stride_vn, "
                   "shape=[N_CTX - kv_lo, ", ("chunk_v.load([start_n - kv_lo, 0])",
                                              "chunk_v.load([start_n - kv_lo + BLOCK_N, 0])"))
    assert err.line == _line_of(ATTENTION, "v = chunk_v.load("), err
    assert ("reads, along dim 2, rows [BLOCK_N + start_n, BLOCK_N + start_n + BLOCK_N) of the descriptor's rows "
            "[kv_lo, N_CTX), which may run past the tile's end") in str(err), err


def test_the_attention_kernel_reads_its_whole_descriptors_a_block_at_a_time_from_the_chunk() -> None:
    # the descriptors over all of K/V (EVEN_N) stay in the chunk only read at the loop's blocks, stepping from its
    # first row: a row later, or a loop from the chunk's second row, runs a row into the next chunk
    for old, new in (("desc_k.load([start_n, 0])", "desc_k.load([start_n + 1, 0])"),
                     ("range(kv_lo, kv_hi, BLOCK_N)", "range(kv_lo + 1, kv_hi, BLOCK_N)"),
                     ("range(kv_lo, kv_hi, BLOCK_N)", "range(kv_lo, kv_end, BLOCK_N)")):
        err = _refused(ATTENTION, old, new)
        assert (err.line, err.column) == (_line_of(ATTENTION, "k = desc_k.load("), 21), (new, err)
        assert "of the descriptor's rows [0, N_CTX), which may run past the tile's end" in str(err), (new, err)
        assert "`len` a multiple of `BLOCK`, which each call checks" in err.hint, err.hint


# -- slow: the forms whose rows stay in the tile equal torch on the race-exposing schedule


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(f"form_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def _col_sums(path: str, name: str, chunk: int) -> float:
    """Column sums of a (B, S, D) tensor whose rows [lo, hi) of S each rank holds, read in chunks of ``chunk`` rows
    (not a rank's shard: a chunk may span two ranks)."""
    rank, world = tilelink.rank(), tilelink.world_size()
    kernel = _load(path, name)
    B, S, D = 3, 37, 16
    x = torch.randn(B, S, D, generator=torch.Generator().manual_seed(21))
    device = current_world().device
    if device.type == "cuda":
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=device))
        x = x.half()
    lo, hi = rows_of(rank, world, S)
    shard = x[:, lo:hi].contiguous().to(device)
    err = 0.0
    for _ in range(2):  # the second call runs at epoch 2
        y = torch.full((B, D), float("nan"), device=device)
        kernel[(B,)](shard, y, S, D, chunk, S * D, D, BLOCK_S=8, BLOCK_D=D)
        err = max(err, (y.cpu() - x.float().sum(1)).abs().max().item(), float("nan") if y.isnan().any() else 0.0)
    return err


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_the_chunked_forms_equal_torch_on_the_race_exposing_schedule(world: int, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    for path, name in ((POINTER, "chunked_col_sum"), (DESCRIPTOR, "chunked_col_sum_desc")):
        for chunk in (7, 13):
            errors = tilelink.spawn(_col_sums, world, str(path), name, chunk)
            assert all(e < 1e-4 for e in errors), (name, chunk, errors)
