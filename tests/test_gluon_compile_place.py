"""Where a Gluon kernel's compile-only build runs (``triton_ext/gluon/launch.py``).

Without ``TRITON_INTERPRET`` it runs in this process (no child is started), gives what the
compile child gives, leaves Triton's hook and cache folder as they were, and leaves in Triton's
cache exactly the build Triton's JIT asks for at a first launch (so a GPU compiles once). Under
``TRITON_INTERPRET=1`` (how the tests run) one compile server child serves every build of the
process, and a child that dies fails its build with an ``InternalError`` and is replaced.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tilews.cache import DiskCache
from tilews.lowering.errors import InternalError
from tilews.triton_ext import passes
from tilews.triton_ext.gluon import GluonProgram, emit
from tilews.triton_ext.gluon import launch as gluon_launch
from tilews.triton_ext.toolchain import triton_version

from .test_gluon_compile import lowered

ROOT = Path(__file__).resolve().parents[1]


def build(name: str, root):
    """A cold compile-only build of case ``name`` (a fresh artifact store under ``root``)."""
    kernel = lowered(name)
    store = DiskCache(root)
    return GluonProgram(emit(kernel), kernel, store, triton_version()), store


@pytest.fixture
def fresh_triton_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    return tmp_path / "triton"


# run in a Python that never had the interpreter on (the tests' own process has: conftest.py);
# prints what the two tests below check
_IN_PROCESS = textwrap.dedent("""
    import json, sys
    import torch, triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import create_function_from_signature
    from tilews.triton_ext import passes
    from tilews.triton_ext.gluon import launch
    from tilews.triton_ext.modules import load_module
    from tests.test_gluon_compile_place import build
    program, store = build("auto_1wg", sys.argv[1])
    out = {"asm": program.asm, "store": sys.argv[1], "children": launch._SERVER.started,
           "hook": repr(knobs.runtime.add_stages_inspection_hook), "cache_dir": knobs.cache.dir}
    # Triton's JIT at a first launch on contiguous, 16-byte aligned tensors (its binder and
    # argument packing, here on CPU tensors: they specialize as CUDA tensors do), under the
    # launcher's checks, with the launcher's options (programmatic dependent launch)
    kernel = program.kernel
    module = load_module(store, program.source, "tilews_gluon")      # as GluonProgram._load does
    fn = getattr(module, kernel.name)
    values = [torch.randn(*p.static_shape).to(p.dtype.torch_dtype) for p in kernel.params]
    args = getattr(module, kernel.name + "_args")(*values)
    backend = make_backend(GPUTarget("cuda", 90, 32))
    options = dict(num_warps=program.num_warps, **launch.gluon_compile.OPTIONS, debug=False,
                   instrumentation_mode=knobs.compilation.instrumentation_mode)
    bound, spec, parsed = create_function_from_signature(fn.signature, fn.params, backend)(*args, **options)
    parsed, signature, constants, attrs = fn._pack_args(backend, options, bound, spec, parsed)
    hits = []
    knobs.compilation.listener = lambda **kw: hits.append(kw["cache_hit"])
    with passes.checking(kernel.fp8_promote_every):
        triton.compile(GluonASTSource(fn, signature, constants, attrs), target=GPUTarget("cuda", 90, 32),
                       options=parsed.__dict__)
    out["jit_cache_hits"] = hits
    out["launch_pdl"] = parsed.launch_pdl
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    root = tmp_path_factory.mktemp("in-process")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(root / "triton")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in sys.path if p])
    proc = subprocess.run([sys.executable, "-c", _IN_PROCESS, str(root / "store")], capture_output=True,
                          text=True, env=env, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), root / "triton"


def test_without_the_interpreter_it_compiles_in_this_process(in_process, tmp_path, fresh_triton_cache):
    out, triton_cache = in_process
    served = build("auto_1wg", tmp_path / "served")[0]
    assert out["children"] == 0
    # the same stages, but for where the source file lies (PTX: its code, before the debug info)
    same_place = {k: v.replace(out["store"], str(tmp_path / "served")) for k, v in out["asm"].items()}
    code = lambda ptx: ptx.split("\t.section\t.debug")[0]      # noqa: E731
    assert code(same_place.pop("ptx")) == code(served.asm["ptx"])
    assert same_place == {k: v for k, v in served.asm.items() if k != "ptx"}
    assert "ttg.warp_specialize" in served.asm["ttgir"] and "wgmma.mma_async" in served.asm["ptx"]
    # Triton's process-wide settings are back as they were; the build is in our cache folder
    assert out["hook"] == "None" and out["cache_dir"] == str(triton_cache)
    assert (triton_cache / passes.cache_key_part()).is_dir()


def test_the_first_launch_finds_the_build_in_tritons_cache(in_process):
    """What Triton's JIT compiles at the first launch is a Triton cache hit of the compile-only
    build: a GPU compiles a Gluon kernel once, and it is launched with programmatic dependent
    launch."""
    assert in_process[0]["jit_cache_hits"] == [True] and in_process[0]["launch_pdl"] is True


def test_one_compile_server_serves_the_process_and_is_replaced_when_it_dies(tmp_path, fresh_triton_cache):
    server = gluon_launch._SERVER
    build("auto_1wg", tmp_path / "a")
    started = server.started
    build("explicit_merged_bm128", tmp_path / "b")
    assert server.started == started                   # the same child built both
    # a child that dies during a build: an InternalError with its output, then a new child
    broken = tmp_path / "broken.py"
    broken.write_text("import os, sys\nprint('about to abort', file=sys.stderr)\nos.abort()\n")
    kernel = lowered("auto_1wg")
    spec = {"fn": "main", "args_fn": "main_args", "num_warps": 4, "target": ["cuda", 90, 32],
            "params": [], "source": str(broken)}
    with pytest.raises(InternalError, match=r"Triton aborted \(signal 6\)") as e:
        server.build(spec, kernel, broken)
    assert "about to abort" in "\n".join(e.value.notes)
    program = build("auto_1wg", tmp_path / "c")[0]
    assert server.started == started + 1 and "wgmma.mma_async" in program.asm["ptx"]
