"""all_reduce on a host `TensorDescriptor` output (`c_desc`, as the persistent-matmul tutorial passes C): the
launcher passes the same descriptor over the symmetric partial sums and sums into the tensor it describes, as
reduce_scatter's does; every rank holds the whole product on the race-exposing schedule."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import triton

import tilelink
from tests.rules.cases import rows_of, worst
from tests.rules.forms_cases import FORMS, _descriptor, _error, _exact, _placed


def all_reduced_form(tmp: Path) -> Path:
    """The persistent host-descriptor GEMM of the kernel forms, its C all-reduced instead of reduce-scattered."""
    source = (FORMS / "gemm_host_descriptor_rs.py").read_text()
    assert 'tilelink.reduce_scatter("c_desc")' in source
    path = tmp / "gemm_host_descriptor_ar.py"
    path.write_text(source.replace('tilelink.reduce_scatter("c_desc")', 'tilelink.all_reduce("c_desc")'))
    return path


def run_all_reduced_descriptor(path: str, M: int = 50, N: int = 40, K: int = 96,
                               blocks: tuple[int, int, int] = (16, 16, 16), programs: int = 3) -> float:
    """This rank's largest error of the all-reduced persistent descriptor GEMM (float32 on the CPU, float16 on a
    GPU, relative to the largest entry there)."""
    spec = importlib.util.spec_from_file_location("gemm_host_descriptor_ar", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kernel = module.matmul_descriptor_persistent_rs
    rank, world = tilelink.rank(), tilelink.world_size()
    bm, bn, bk = blocks
    g = torch.Generator().manual_seed(23)
    a, b = _exact(torch.randn(M, K, generator=g), torch.randn(K, N, generator=g))
    klo, khi = rows_of(rank, world, K)  # each rank holds a slice of K (a multiple of 8: 16-byte descriptor rows)
    ar, bt = _placed(a[:, klo:khi].contiguous(), b[klo:khi].T.contiguous())
    programs = min(programs, triton.cdiv(M, bm) * triton.cdiv(N, bn))
    err = 0.0
    for _ in range(2):  # the second call runs at epoch 2
        out = torch.full((M, N), float("nan"), dtype=ar.dtype, device=ar.device)
        kernel[(programs,)](_descriptor(ar, [bm, bk]), _descriptor(bt, [bn, bk]), _descriptor(out, [bm, bn]), M, N,
                            khi - klo, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=2, EPILOGUE_SUBTILE=False,
                            NUM_SMS=programs)
        err = worst(err, float("nan") if out.isnan().any() else _error(out, a @ b))
    return err


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 3])
def test_an_all_reduced_host_descriptor_holds_the_sum_on_every_rank(world: int, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    errors = tilelink.spawn(run_all_reduced_descriptor, world, str(all_reduced_form(tmp_path)))
    assert all(isinstance(e, float) and e < 1e-3 for e in errors), errors
