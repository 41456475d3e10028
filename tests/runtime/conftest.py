"""Runtime tests: emulated worlds of CPU processes (tilelink.spawn).

The functions that run on the ranks live in ``runtime_worlds.py`` (``tests.runtime.runtime_worlds``, by that
name in the spawned rank processes too) and ``examples/handwritten_ag_gemm.py`` (``examples.handwritten_ag_gemm``).
"""
