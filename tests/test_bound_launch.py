"""``bound_launch``: a kept call's launch straight to Triton's C launcher, for Gluon and ``tl``
programs (``triton_ext/launcher.py``, ``triton_ext/gluon/launch.py``, ``triton_ext/tl/launch.py``,
``triton_ext/gluon/descriptors.py``).

Without a GPU: Hopper kernels compiled compile-only, Triton's JIT and C launcher stubbed (the
stub records what each launch passes; a TMA descriptor's "encoding" names the tensor's address,
the box and the descriptor's position). The bound launch must pass exactly what the general path
(``launch``: Triton's specialization, the descriptor cache, ``DirectLaunch.expand``) passes, for
every call, new addresses included, and must hand a call to the general path where the direct
launch would be wrong: a launch hook listening, a pointer whose alignment or an integer whose
class Triton specializes on differs from the first call's, another current device.
"""
from __future__ import annotations

import types

import pytest
import torch

import tilews
import tilews.language as T
from tilews.ops import fp8 as fp8_ops
from tilews.ops import gemm_programs
from tilews.triton_ext import launcher as launcher_module
from tilews.triton_ext.gluon import launch as gluon_launch
from tilews.testing import rel_err
from tilews.triton_ext.gluon.descriptors import DescriptorSite

E4M3 = torch.float8_e4m3fn


class _CLauncher:
    """Triton's C launcher (a built-in: no Python code object), recording each launch."""

    def __init__(self, record):
        self.record = record

    def __call__(self, *args):
        self.record.append(("raw", args))


class _Compiled:
    """What Triton's JIT returns at a first launch, as ``DirectLaunch.of`` reads it."""

    def __init__(self, record, descriptors: list[int]):
        self.function, self.packed_metadata = "function", (4, 1, 1024)
        raw = _CLauncher(record)
        launcher, tensordesc_indices = raw, set(descriptors)
        tensordesc_meta = [{"position": i} for i in descriptors]

        def wrapper(*args):          # Triton 3.6's descriptor wrapper, read by its closure's names
            return launcher, tensordesc_indices, tensordesc_meta

        class Run:
            global_scratch_size = profile_scratch_size = 0
            launch = wrapper if descriptors else raw
            launch_cooperative_grid, launch_pdl = False, True

            def __call__(self, *args):
                record.append(("run", args))
        self.run = Run()

    def launch_metadata(self, grid, stream, *args):
        return None


class _Record(list):
    """The launches; ``device["current"]``: the device the stubbed driver calls current."""
    device: dict


@pytest.fixture
def stub_gpu(monkeypatch):
    """Launches recorded, not run: [(how, arguments)] per launch ("jit": the first one, "raw":
    the C launcher, "run": the compiled kernel's own run, as with a launch hook), each launch
    through ``Launcher.launch`` (the general path) marked "general" first."""
    import triton.backends.nvidia.driver as nvidia
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    record = _Record()
    device = {"current": 0}
    monkeypatch.setattr(gluon_launch, "_require_hopper", lambda: None)
    monkeypatch.setattr(launcher_module._THREAD, "has_context", True, raising=False)
    init = launcher_module.Launcher.__init__

    class Jit:
        def __getitem__(self, grid):
            def first(*args, num_warps, **options):
                record.append(("jit", args))
                return _Compiled(record, [i for i, a in enumerate(args) if isinstance(a, TensorDescriptor)])
            return first

    def stubbed(self, fn, num_warps, compiling=None, options=None):
        init(self, fn, num_warps, options=options)
        self.fn, self.interpreted = Jit(), False
        self._driver = types.SimpleNamespace(active=types.SimpleNamespace(
            get_current_device=lambda: device["current"], get_current_stream=lambda d: 70 + d))
    monkeypatch.setattr(launcher_module.Launcher, "__init__", stubbed)
    general = launcher_module.Launcher.launch

    def launch(self, grid, args):        # the general path, marked
        record.append(("general", ()))
        general(self, grid, args)
    monkeypatch.setattr(launcher_module.Launcher, "launch", launch)
    monkeypatch.setattr(nvidia, "make_tensordesc_arg", lambda desc, meta: [
        ("map", desc.base.data_ptr(), tuple(desc.block_shape), meta["position"]), *desc.shape, *desc.strides])
    record.device = device
    return record


def _program(kernel):
    (compiled,) = kernel.kernels
    return compiled.program


def _fp8_swapped(M=16, N=128, K=256):
    """``fp8_scaled_mm``'s swapped kernel (TMA operands, pointers for the scales and C) and its
    values for random inputs."""
    a, w = torch.randn(M, K).to(E4M3), torch.randn(N, K).to(E4M3)
    tiles = fp8_ops.Tiles(64, 16, 2, 128, swap_ab=True)
    args, operands = fp8_ops.tiled_kernel_mapping(tiles, a, w.t(), torch.tensor(0.5), torch.tensor(2.0))
    kernel = tilews.jit(out_idx=[-1], target="hopper")(fp8_ops.scaled_mm_kernel.__wrapped__)(*args, tiles.hints())

    def values():
        a, w = torch.randn(M, K).to(E4M3), torch.randn(N, K).to(E4M3)
        return [*operands(a, w.t(), torch.tensor(0.5), torch.tensor(2.0)), torch.empty(N, M, dtype=torch.bfloat16)]
    return _program(kernel), values


def _general(program, values, record) -> tuple:
    """What the general path passes for ``values`` (after its first launch, the C launcher)."""
    program.launch(values)
    (general, _), (how, args) = record[-2:]
    del record[-2:]
    assert (general, how) == ("general", "raw")
    return args


def test_bound_launch_passes_what_launch_passes(stub_gpu):
    program, values = _fp8_swapped()
    bound = program.bound_launch()
    first = values()
    bound(first)                                   # the first call: Triton's JIT, then ready
    assert [how for how, _ in stub_gpu] == ["general", "jit"]
    for vs in [first, values(), values(), first]:  # the first's addresses again: cached expansions
        stub_gpu.clear()
        bound(vs)
        assert [how for how, _ in stub_gpu] == ["raw"]
        direct = stub_gpu.pop()[1]
        assert direct == _general(program, vs, stub_gpu)
        encoded = [a for a in direct if isinstance(a, tuple) and a[:1] == ("map",)]
        assert [e[1] for e in encoded] == [vs[0].data_ptr(), vs[2].data_ptr()]     # a's and w's maps


def test_bound_launch_goes_the_general_way_where_it_must(stub_gpu):
    program, values = _fp8_swapped()
    bound = program.bound_launch()
    vs = values()
    bound(vs)
    stub_gpu.clear()

    def how(vs) -> list[str]:
        """What the call did: "direct raw" (straight to the C launcher), else what the general
        path did ("raw", "run" with a hook, "jit" for a new specialization)."""
        stub_gpu.clear()
        bound(vs)
        hows = [h for h, _ in stub_gpu]
        return hows[1:] if hows[0] == "general" else [f"direct {h}" for h in hows]

    assert how(vs) == ["direct raw"]
    from triton import knobs
    seen = []
    knobs.runtime.launch_enter_hook.add(seen.append)
    try:
        assert how(vs) == ["run"]                   # the compiled kernel's run calls the hook
    finally:
        knobs.runtime.launch_enter_hook.remove(seen.append)
    assert how(vs) == ["direct raw"]
    misaligned = list(vs)
    misaligned[1] = torch.zeros(5)[1:2]             # scale_a (a pointer) 4 bytes past 16
    assert how(misaligned) == ["jit"]               # another specialization: Triton compiles
    stub_gpu.device["current"] = 1
    assert how(vs) == ["jit"]                       # another device: its own compiled kernel
    stub_gpu.device["current"] = 0
    assert how(vs) == ["direct raw"]


def test_an_integers_class_decides_as_tritons_does(stub_gpu):
    """A runtime dim reaches the kernel as an integer; a value of another class (1, or not a
    multiple of 16) launches through the general path, which gives Triton its own kernel."""
    kernel = tilews.jit(out_idx=[-1], target="hopper")(gemm_programs.tiled.fn)(
        T.dynamic("M"), 256, 256, block_M=64, block_N=128, block_K=64, num_stages=2)
    program = _program(kernel)
    assert [p.name for p in program.kernel.params] == ["M", "A", "B", "C"]

    def values(M):
        return [M, torch.randn(M, 256).bfloat16(), torch.randn(256, 256).bfloat16(),
                torch.empty(M, 256, dtype=torch.bfloat16)]
    bound = program.bound_launch()
    bound(values(64))
    stub_gpu.clear()
    bound(values(128))                              # 128: the class of 64 (multiple of 16)
    assert [h for h, _ in stub_gpu] == ["raw"] and stub_gpu[-1][1][:3] == (2, 2, 1)
    bound(values(1))
    assert [h for h, _ in stub_gpu][-2:] == ["general", "jit"]


def test_a_descriptor_site_encodes_each_address_once():
    from triton.experimental.gluon.language import NVMMASharedLayout
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    layout = NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    encoded = []

    def encode(desc):
        encoded.append(desc.base.data_ptr())
        return [("map", desc.base.data_ptr(), tuple(desc.block_shape)), *desc.shape, *desc.strides]
    site = DescriptorSite(TensorDescriptor.from_tensor, [64, 64], layout, encode, capacity=2)
    x, y, z = (torch.randn(128, 64).bfloat16() for _ in range(3))
    assert site(x) == [("map", x.data_ptr(), (64, 64)), 128, 64, 64, 1] and site(x) is site(x)
    site(y)
    assert encoded == [x.data_ptr(), y.data_ptr()]
    site(z)                                          # a third address: the site starts over
    site(x)
    assert encoded == [x.data_ptr(), y.data_ptr(), z.data_ptr(), x.data_ptr()]


def test_a_tl_program_launches_directly_too(stub_gpu):
    """A ``triton.language`` program (pointers and strides, a runtime dim): the same arguments
    as the general path; a pointer 4 bytes past 16-byte alignment goes the general way (Triton
    compiles the unaligned specialization)."""
    kernel = tilews.jit(out_idx=[-1], target="triton")(gemm_programs.tiled.fn)(
        T.dynamic("M"), 64, 64, block_M=32, block_N=32, block_K=32, num_stages=1)
    program = _program(kernel)

    def values(M, a=None):
        return [M, torch.randn(M, 64) if a is None else a, torch.randn(64, 64), torch.empty(M, 64)]
    bound = program.bound_launch()
    bound(values(32))
    for vs in (values(32), values(48)):
        stub_gpu.clear()
        bound(vs)
        assert [h for h, _ in stub_gpu] == ["raw"]
        direct = stub_gpu.pop()[1]
        assert direct == _general(program, vs, stub_gpu)
    stub_gpu.clear()
    bound(values(32, a=torch.randn(32 * 64 + 1)[1:].view(32, 64)))
    assert [h for h, _ in stub_gpu] == ["general", "jit"]


def test_under_tritons_interpreter_every_call_is_interpreted():
    """A ``tl`` program under Triton's CPU interpreter (the tests' own setting) has no compiled
    kernel and no driver to ask for one: its kept calls launch through the interpreter, each
    with the call's own values."""
    kernel = tilews.jit(out_idx=[-1], target="triton")(gemm_programs.tiled.fn)(
        T.dynamic("M"), 64, 64, block_M=32, block_N=32, block_K=32, num_stages=1)
    a, b = torch.randn(40, 64).bfloat16(), torch.randn(64, 64).bfloat16()
    call = kernel.bound((a, b))
    for seed in (1, 2):
        a, b = (torch.randn(*shape, generator=torch.Generator().manual_seed(seed + i)).bfloat16()
                for i, shape in enumerate(((40, 64), (64, 64))))
        assert rel_err(call(a, b), a.double() @ b.double()) < 1e-2
