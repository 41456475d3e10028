"""How the rules launch their partner kernels: on a GPU the SM pull partners take large steps and many
warps (their bandwidth is the bytes each SM has in flight over the link); in the emulated world small
steps, so that a channel spans several blocks in the tests; their vector loads need aligned copies."""

from __future__ import annotations

import types

import pytest
import torch

import tilelink
from tilelink.rules.launch import Launcher, check_vector_aligned


def _launcher() -> Launcher:
    return Launcher.__new__(Launcher)  # pull_meta needs no kernel


def test_pull_partners_take_large_steps_on_a_gpu_only():
    gpu = types.SimpleNamespace(device=torch.device("cuda", 0))
    cpu = types.SimpleNamespace(device=torch.device("cpu"))
    launcher = _launcher()
    on_gpu = launcher.pull_meta(gpu, Launcher.PULL_CONSUMER_GPU)
    assert on_gpu["BLOCK"] >= 4 * Launcher.BLOCK and on_gpu["num_warps"] > 4
    assert launcher.pull_meta(gpu, Launcher.PULL_PRODUCER_GPU)["BLOCK"] >= 4 * Launcher.BLOCK
    assert launcher.pull_meta(cpu, Launcher.PULL_CONSUMER_GPU) == {"BLOCK": Launcher.BLOCK}
    on_gpu["BLOCK"] = 1  # a copy: the class's setting is not changed by a caller
    assert Launcher.PULL_CONSUMER_GPU["BLOCK"] != 1


def test_vector_loads_need_aligned_copies():
    check_vector_aligned([0x7F0000000000, 0x7F0000000010])
    with pytest.raises(tilelink.LaunchError, match=r"16-byte aligned.*0x7f0000000008"):
        check_vector_aligned([0x7F0000000000, 0x7F0000000008])
