"""How a reduce-scatter producer counts the elements a tile stored, which its notify adds to the
channel: rows x columns, the columns counted from the live column vector, when the store mask separates
into a row part and a column part; the generic per-element sum otherwise. Both must give the consumer
the same totals, so both run end to end."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import tilelink
from tests.rules.cases import HERE, moe_down_from_file
from tilelink.errors import AnnotationError

SEPARABLE = "mask=token_mask[:, None] & (offs_bn[None, :] < N))"
# the same elements, in a form the rewriter cannot split into rows x columns (acc == acc holds: no NaN)
ENTANGLED = "mask=token_mask[:, None] & (offs_bn[None, :] < N) & (acc == acc))"
# a bound that is an expression of lower precedence than the subtraction an inlined count would use
LOW_PRECEDENCE_BOUND = "mask=token_mask[:, None] & (offs_bn[None, :] < N & 65535))"


def _variant(tmp_path: Path, mask: str) -> Path:
    source = (HERE / "reduce_scatter" / "moe_scatter_topk.before.py").read_text()
    assert source.count(SEPARABLE) == 1
    path = tmp_path / "moe_down_variant.py"
    path.write_text(source.replace(SEPARABLE, mask))
    return path


def _kernel(path: Path):
    """The overlapped kernel of a generated variant (its source, its report)."""
    spec = importlib.util.spec_from_file_location("moe_down_variant_text", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.fused_moe_down_kernel


def _generated(path: Path) -> str:
    return _kernel(path).source


def test_separable_dynamic_mask_counts_rows_times_columns(tmp_path: Path) -> None:
    # the columns from the column vector's definition (offs_bn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)):
    # scalar arithmetic, no reduction across the program's threads
    text = _generated(_variant(tmp_path, SEPARABLE))
    assert "tlk_stored = tl.where(token_mask, tl.minimum(tl.maximum((N) - (pid_n * BLOCK_N), 0), BLOCK_N), 0)" in text
    assert "tlk_stored = tl.sum(" not in text and "tl.sum((offs_bn" not in text


def test_a_column_bound_the_launch_cannot_read_is_refused_for_rows_from_an_index(tmp_path: Path) -> None:
    """Rows from an index have their columns bounded at the launch as a tile's are: a bound of lower precedence
    than a sum of products (`N & 65535`) is not read, and columns starting at a program's position have no end
    TileLink knows either, so the store could write past the row."""
    with pytest.raises(AnnotationError, match="bounded by a mask TileLink cannot read at the launch"):
        _generated(_variant(tmp_path, LOW_PRECEDENCE_BOUND))


COLUMNS = "    offs_bn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)\n"


@pytest.mark.slow
@pytest.mark.parametrize(("change", "why"), [
    # the start's name is bound again after the column vector is made: at the store it means something else
    (COLUMNS + "    pid_n = pid_n + 1000\n", "rebound"),
])
def test_column_count_falls_back_to_the_vector_when_its_definition_does_not_hold_at_the_store(
        tmp_path: Path, change: str, why: str) -> None:
    source = (HERE / "reduce_scatter" / "moe_scatter_topk.before.py").read_text()
    assert source.count(COLUMNS) == 1
    path = tmp_path / f"moe_down_{why}.py"
    path.write_text(source.replace(COLUMNS, change))
    text = _generated(path)
    assert "tlk_stored = tl.where(token_mask, tl.sum((offs_bn < (N)).to(tl.int32)), 0)" in text, text
    assert "tl.maximum((N) - (pid_n" not in text
    for err in tilelink.spawn(moe_down_from_file, 2, str(path)):
        assert err < 1e-3, err


def test_columns_that_wrap_are_refused_for_rows_from_an_index(tmp_path: Path) -> None:
    """`(start + tl.arange(0, BLOCK_N)) % (N + BLOCK_N)`: columns TileLink cannot bound within the row."""
    source = (HERE / "reduce_scatter" / "moe_scatter_topk.before.py").read_text()
    path = tmp_path / "moe_down_modulo.py"
    wrapped = "    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % (N + BLOCK_N)\n"
    path.write_text(source.replace(COLUMNS, wrapped))
    with pytest.raises(AnnotationError, match="which TileLink cannot"):
        _generated(path)


@pytest.mark.slow
def test_entangled_dynamic_mask_falls_back_to_the_generic_count_and_still_matches(tmp_path: Path) -> None:
    path = _variant(tmp_path, ENTANGLED)
    text = _generated(path)
    assert "tlk_stored = tl.sum(tl.where(token_mask[:, None] & (offs_bn[None, :] < N) & (acc == acc), 1, 0)" in text
    for err in tilelink.spawn(moe_down_from_file, 3, str(path)):
        assert err < 1e-3, err


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3])
def test_moe_reduction_on_the_copy_engine(tmp_path: Path, world: int) -> None:
    # the hybrid with top-k: a token's expert slots travel to the rank owning the token as one range of
    # rows (copy engine), then one SM kernel sums the slots of every rank (the GEMM keeps every SM)
    source = (HERE / "reduce_scatter" / "moe_scatter_topk.before.py").read_text()
    old = 'size="num_valid_tokens // top_k"))'
    assert source.count(old) == 1
    path = tmp_path / "moe_down_hybrid.py"
    path.write_text(source.replace(old, 'size="num_valid_tokens // top_k"), via="copy_engine")'))
    kernel = _kernel(path)
    assert "rs_topk_reduce" in kernel.source and "rs_reduce_received" in kernel.source
    # the GEMM notifies nothing: the top-k reduce follows it on its stream, and the report says so
    body = kernel.source.split("def fused_moe_down_kernel", 1)[1].split("# partner kernels", 1)[0]
    assert "notify" not in body, body
    assert any("no notify after the store" in entry.message for entry in kernel.report.entries), kernel.report
    for err in tilelink.spawn(moe_down_from_file, world, str(path)):
        assert err < 1e-3, err


def test_partial_sums_past_32_bit_offsets_are_refused() -> None:
    from tests.rules.cases import moe_down_too_large

    (message,) = tilelink.spawn(moe_down_too_large, 1)
    assert "2147483648 elements (8388608 x 256)" in message and "split the call along" in message, message
