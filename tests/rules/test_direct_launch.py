"""Launching a compiled variant again without Triton's launch path (``tilelink.rules.direct``): which calls launch
the compiled kernel kept from an earlier call, which go through Triton again, and the arguments the compiled kernel
gets. Triton's interpreter has no compiled kernels, so a kernel here returns a stand-in for one."""

from __future__ import annotations

import pytest
import torch
import triton.language as tl
from triton import knobs
from triton.runtime.jit import JITFunction

from tilelink.rules import direct as d


class CompiledKernel:
    """What ``kernel[grid](...)`` returns on a GPU, as far as a launch reads it: it records its launches."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.function, self.packed_metadata = f"function {number}", (number,)
        self.launches: list[tuple] = []

    def run(self, *args) -> None:
        self.launches.append(args)

    def launch_metadata(self, grid, stream, *args):
        return ("metadata", tuple(grid), stream)


class Kernel(JITFunction):
    """A ``@triton.jit`` kernel whose launch through Triton is recorded and returns a new compiled kernel."""

    def __init__(self, fn, **kwargs) -> None:
        super().__init__(fn, **kwargs)
        self.through_triton: list[dict] = []
        self.result = "compiled"

    def run(self, *args, grid, warmup, **kwargs):
        self.through_triton.append(dict(zip(self.arg_names, args, strict=False)) | kwargs)
        return CompiledKernel(len(self.through_triton)) if self.result == "compiled" else None


def _body(x_ptr, n, tlk_epoch, scale, flag=True, BLOCK: tl.constexpr = 16):
    pass


@pytest.fixture
def gpu(monkeypatch):
    """The current device and stream, as the launch reads them on a GPU; no capture."""
    state = {"device": 0, "stream": 1234, "capturing": False}
    monkeypatch.setattr(d, "_current_device", lambda: state["device"])
    monkeypatch.setattr(d, "_current_stream", lambda device: state["stream"] + device)
    monkeypatch.setattr(d, "_capturing", lambda: state["capturing"])
    return state


def _kernel() -> tuple[Kernel, d.DirectKernel]:
    kernel = Kernel(_body, do_not_specialize=["tlk_epoch"])
    return kernel, d.DirectKernel(kernel)


def test_a_variant_seen_before_launches_its_compiled_kernel(gpu) -> None:
    kernel, fast = _kernel()
    x = torch.zeros(64)
    first = fast[(4,)](x, 3, 1, 0.5, BLOCK=32)
    assert len(kernel.through_triton) == 1 and isinstance(first, CompiledKernel) and not first.launches
    # new data, a new epoch (not specialised on), another int Triton treats alike (3 -> 5), another float
    again = fast[(4, 2)](torch.ones(64), 5, 2, 1.5, BLOCK=32)
    assert again is first and len(kernel.through_triton) == 1
    ((launch),) = first.launches
    grid, stream, function, packed, hooks, args = launch[:3], launch[3], launch[4], launch[5], launch[6:9], launch[9:]
    assert grid == (4, 2, 1) and stream == 1234 and (function, packed) == ("function 1", (1,))
    assert hooks == (None, None, None)  # no launch hook is set: none is called
    # every argument in the kernel's parameter order, defaults included (the launcher ignores the constexprs)
    assert args[1:] == (5, 2, 1.5, True, 32) and torch.equal(args[0], torch.ones(64))
    fast[lambda named: (named["n"], 3)](x, n=7, tlk_epoch=3, scale=0.0, BLOCK=32)  # a grid of the arguments
    assert first.launches[-1][:3] == (7, 3, 1) and len(kernel.through_triton) == 1


@pytest.mark.parametrize("change", ["dtype", "misaligned", "int is 1", "int of 16", "constexpr", "option",
                                    "device", "debug", "fp fusion", "arch"])
def test_what_triton_specialises_on_takes_its_launch_again(gpu, monkeypatch, change) -> None:
    kernel, fast = _kernel()
    x = torch.zeros(64)
    base = dict(x_ptr=x, n=3, tlk_epoch=1, scale=0.5, BLOCK=32)
    fast[(1,)](**base)
    other = {"dtype": dict(x_ptr=x.half()), "misaligned": dict(x_ptr=x[1:]), "int is 1": dict(n=1),
             "int of 16": dict(n=32), "constexpr": dict(BLOCK=64), "option": dict(num_warps=8)}.get(change, {})
    if change == "device":
        gpu["device"] = 1
    if change == "debug":
        monkeypatch.setattr(knobs.runtime, "debug", True)
    if change == "fp fusion":  # TRITON_DEFAULT_FP_FUSION=0: Triton's options compile the kernel without FMAs
        monkeypatch.setattr(knobs.language, "default_fp_fusion", False)
    if change == "arch":  # TRITON_OVERRIDE_ARCH: Triton's options compile for another architecture
        monkeypatch.setattr(knobs.runtime, "override_arch", "sm80")
    fast[(1,)](**{**base, **other})
    assert len(kernel.through_triton) == 2, change  # a new variant: compiled by Triton, then kept
    fast[(1,)](**{**base, **other})
    assert len(kernel.through_triton) == 2 and len(fast.compiled) == 2


def test_what_falls_back_to_triton(gpu, monkeypatch) -> None:
    kernel, fast = _kernel()
    x = torch.zeros(64)
    call = dict(x_ptr=x, n=3, tlk_epoch=1, scale=0.5)
    fast[(1,)](**call)
    gpu["capturing"] = True  # a stream capturing a CUDA graph: Triton's own launch, nothing kept
    fast[(1,)](**call)
    assert len(kernel.through_triton) == 2 and len(fast.compiled) == 1
    gpu["capturing"] = False
    kernel.pre_run_hooks.append(lambda *a, **k: None)  # a pre-run hook is Triton's to call
    fast[(1,)](**call)
    assert len(kernel.through_triton) == 3
    kernel.pre_run_hooks.clear()
    namespace = {"SCALE": 2}  # a global the kernel read when it compiled has changed: Triton's launch raises
    monkeypatch.setattr(kernel, "used_global_vals", {("SCALE", id(namespace)): (1, namespace)})
    fast[(1,)](**call)
    assert len(kernel.through_triton) == 4
    monkeypatch.setattr(kernel, "used_global_vals", {("SCALE", id(namespace)): (2, namespace)})
    fast[(1,)](**call)
    assert len(kernel.through_triton) == 4  # unchanged since: direct
    fast[(1,)](**call)
    namespace["SCALE"] = 3  # changed after launches that found it unchanged
    fast[(1,)](**call)
    assert len(kernel.through_triton) == 5
    # a launch that returns no compiled kernel (the interpreter's) keeps nothing: every call goes through Triton
    kernel2, fast2 = _kernel()
    kernel2.result = None
    for _ in range(2):
        assert fast2[(1,)](**call) is None
    assert len(kernel2.through_triton) == 2 and not fast2.compiled


def test_launch_hooks_get_their_metadata(gpu) -> None:
    kernel, fast = _kernel()
    call = dict(x_ptr=torch.zeros(64), n=3, tlk_epoch=1, scale=0.5)
    compiled = fast[(2,)](**call)
    seen = []
    hook = seen.append
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        fast[(2,)](**call)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    metadata, enter, leave = compiled.launches[-1][6:9]
    assert metadata == ("metadata", (2,), 1234)
    assert enter is knobs.runtime.launch_enter_hook and leave is knobs.runtime.launch_exit_hook


def test_only_a_compiled_plain_jit_kernel_is_launched_directly() -> None:
    kernel = JITFunction(_body)
    # here Triton runs interpreted (or this build of torch has no CUDA): the kernel itself, launched by Triton
    assert d.direct(kernel) is kernel
    assert not d.supported(kernel) and not d.supported(object())
    assert d.direct(kernel) is d.direct(kernel)


def test_the_variant_has_the_terms_of_variant_key(gpu) -> None:
    from tilelink.rules.launch import variant_key

    kernel, fast = _kernel()
    x = torch.zeros(64)
    calls = [dict(x_ptr=x, n=3, tlk_epoch=1, scale=0.5, BLOCK=32), dict(x_ptr=x, n=5, tlk_epoch=9, scale=2.5, BLOCK=32),
             dict(x_ptr=x[1:], n=3, tlk_epoch=1, scale=0.5, BLOCK=32), dict(x_ptr=x[4:], n=3, tlk_epoch=1, scale=0.5,
                                                                              BLOCK=32),
             dict(x_ptr=x.double(), n=3, tlk_epoch=1, scale=0.5, BLOCK=32), dict(x_ptr=x, n=1, tlk_epoch=1, scale=0.5,
                                                                                 BLOCK=32),
             dict(x_ptr=x, n=48, tlk_epoch=16, scale=0.5, BLOCK=32), dict(x_ptr=x, n=1 << 40, tlk_epoch=1 << 40,
                                                                            scale=0.5, BLOCK=32),
             dict(x_ptr=x, n=-(1 << 63), tlk_epoch=1, scale=0.5, BLOCK=32), dict(x_ptr=x, n=3, tlk_epoch=1, scale=1,
                                                                                  BLOCK=32),
             dict(x_ptr=x, n=3, tlk_epoch=1, scale=0.5, BLOCK=64), dict(x_ptr=x, n=3, tlk_epoch=1, scale=0.5, BLOCK=32,
                                                                          num_warps=4),
             dict(x_ptr=x, n=3, tlk_epoch=1, scale=0.5, flag=None, BLOCK=32),
             dict(x_ptr=torch.nn.Parameter(x), n=3, tlk_epoch=1, scale=(1, x), BLOCK=32)]
    keys = [fast.read(call)[0] for call in calls]
    for i, a in enumerate(calls):
        for j, b in enumerate(calls):
            same_form = list(a) == list(b) and list(map(type, a.values())) == list(map(type, b.values()))
            assert (keys[i] == keys[j]) == (same_form and variant_key(kernel, a) == variant_key(kernel, b)), (i, j)
            # the launchers' warm-up keys a kernel launched directly with its generated reader: the same partition
            assert (variant_key(fast, a) == variant_key(fast, b)) == (keys[i] == keys[j]), (i, j)
    assert keys[0] == keys[1]  # the values Triton does not specialise on


def test_a_bound_launch_reads_only_its_tensors(gpu) -> None:
    """``DirectKernel.bound``: the other arguments fixed, a call passes its tensors; a variant an unbound call
    compiled is launched without Triton, and the compiled kernel gets every argument in the parameter order."""
    kernel, fast = _kernel()
    x = torch.zeros(64)
    call = dict(x_ptr=x, n=3, tlk_epoch=1, scale=0.5, BLOCK=32)
    first = fast[(4,)](**call)
    bound = fast.bound((4,), call, ("x_ptr",))
    y = torch.ones(64)
    assert bound(y) is first and len(kernel.through_triton) == 1  # the variant's compiled kernel, found
    assert bound(x) is first and len(kernel.through_triton) == 1 and len(bound.compiled) == 1
    launch = first.launches[-1]
    assert launch[:4] == (4, 1, 1, 1234) and launch[10:] == (3, 1, 0.5, True, 32) and launch[9] is x


def test_a_bound_launch_of_ints_reads_what_triton_specialises_them_on(gpu) -> None:
    """Ints among a bound launch's names (a handshake's call number and budget): one not specialised on (the
    epoch) is keyed by its width only, one specialised on by whether it is 1 and a multiple of 16 too; each new
    form takes Triton's launch once, a form seen again the compiled kernel with the call's values."""
    kernel, fast = _kernel()
    x = torch.zeros(64)
    bound = fast.bound((1,), dict(x_ptr=x, n=3, tlk_epoch=1, scale=0.5), ("tlk_epoch", "n"))
    first = bound(1, 3)
    assert bound(2, 5) is first and bound(1 << 20, 7) is first and len(kernel.through_triton) == 1
    assert first.launches[-1][9] is x and first.launches[-1][10:12] == (7, 1 << 20)  # the values given, in order
    for epoch, n in ((1 << 40, 3), (1, 1), (1, 32)):  # a 64-bit epoch; n equal to 1; n a multiple of 16
        bound(epoch, n)
        bound(epoch + 2, n)
    assert len(kernel.through_triton) == 4 and len(bound.compiled) == 4


def test_a_bound_launch_finds_a_compiled_variant_without_launching(gpu) -> None:
    """``Bound.find``: the compiled kernel a call would launch, from this launch's calls or the kernel's calls of every
    argument of the same form (a launcher's first calls), or None where Triton's launch path would be taken (a
    variant not compiled yet, a capture), launching nothing; ``Bound.launch`` launches what it found."""
    kernel, fast = _kernel()
    x = torch.zeros(64)
    call = dict(x_ptr=x, n=3, tlk_epoch=1, scale=0.5)
    bound = fast.bound((2,), call, ("x_ptr", "tlk_epoch"))
    assert bound.find(x, 2) is None and not kernel.through_triton  # nothing compiled yet, nothing launched
    first = fast[(2,)](**call)  # a call of every argument, of the same form
    compiled, arguments = bound.find(torch.ones(64), 5)
    assert compiled is first and not first.launches and arguments[1:3] == (3, 5)
    bound.launch((compiled, arguments))
    assert first.launches[-1][:3] == (2, 1, 1) and first.launches[-1][11] == 5 and len(kernel.through_triton) == 1
    assert bound.find(x[1:], 5) is None  # another alignment: not compiled
    gpu["capturing"] = True
    assert bound.find(x, 5) is None and len(kernel.through_triton) == 1


@pytest.mark.parametrize("change", ["dtype", "misaligned", "type", "device", "debug", "fp fusion", "arch",
                                    "fp fusion variable", "arch variable"])
def test_a_bound_launch_takes_triton_for_a_new_variant(gpu, monkeypatch, change) -> None:
    kernel, fast = _kernel()
    x = torch.zeros(64)
    bound = fast.bound((1,), dict(x_ptr=x, n=3, tlk_epoch=1, scale=0.5), ("x_ptr",))
    bound(x)
    assert len(kernel.through_triton) == 1
    other = {"dtype": x.half(), "misaligned": x[1:], "type": torch.nn.Parameter(x)}.get(change, x)
    if change == "device":
        gpu["device"] = 1
    if change == "debug":
        monkeypatch.setattr(knobs.runtime, "debug", True)
    if change == "fp fusion":
        monkeypatch.setattr(knobs.language, "default_fp_fusion", False)
    if change == "arch":
        monkeypatch.setattr(knobs.runtime, "override_arch", "sm80")
    if change == "fp fusion variable":  # the environment, read at each call as Triton reads it
        monkeypatch.delattr(knobs.language, "default_fp_fusion")  # none set in Python (a setattr undone sets one)
        monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
        assert knobs.language.default_fp_fusion is False
    if change == "arch variable":
        monkeypatch.delattr(knobs.runtime, "override_arch")
        monkeypatch.setenv("TRITON_OVERRIDE_ARCH", "sm80")
        assert knobs.runtime.override_arch == "sm80"
    bound(other)
    assert len(kernel.through_triton) == 2, change  # Triton's launch, which compiles the variant
    assert kernel.through_triton[-1]["x_ptr"] is other
    bound(other)
    assert len(kernel.through_triton) == 2 and len(bound.compiled) == 2, change  # then kept


def test_a_bound_launch_falls_back_to_triton(gpu) -> None:
    kernel, fast = _kernel()
    x = torch.zeros(64)
    bound = fast.bound((1,), dict(x_ptr=x, n=3, tlk_epoch=1, scale=0.5), ("x_ptr",))
    bound(x)
    gpu["capturing"] = True  # a capture: Triton's own launch
    bound(x)
    assert len(kernel.through_triton) == 2 and len(bound.compiled) == 1
    gpu["capturing"] = False
    missing = fast.bound((1,), dict(x_ptr=x, n=3, scale=0.5), ("x_ptr",))  # tlk_epoch missing: Triton says so
    missing(x)
    missing(x)
    assert len(kernel.through_triton) == 4 and not missing.compiled
