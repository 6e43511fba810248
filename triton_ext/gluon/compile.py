"""Compile-only build of an emitted Gluon module: ``build(spec)``, in this process or a child.

SPEC names the module file, its kernel function and host argument function, ``num_warps``, the
target and the kernel's parameters (buffers: shape and torch dtype; scalars: Triton type). The
argument function is called on meta tensors, so the signature of each TMA descriptor comes from
Gluon's own ``TensorDescriptor`` and ``mangle_type``; then ``triton.compile`` builds for the
target, specialized as Triton's JIT specializes contiguous, 16-byte aligned tensors at launch,
with ``OPTIONS`` (the launcher's first launch passes the same) and our TTGIR passes
(``passes.checking``), and the result holds the text stages (``ttgir``, ``llir``, ``ptx``, ...)
and some metadata (``launch_pdl`` among it). SPEC's optional ``fp8_promote_every`` (int, default 0)
is the K a block-scaled FP8 kernel covers between promotions, checked by the FP8 verifier; a
verifier finding is the result's ``verifier_error`` (and ``notes``) instead of the stages.

Run by path (it then imports nothing from tilews before its arguments are read) it is the compile
child ``launch.py`` uses where this process cannot compile Gluon (under ``TRITON_INTERPRET=1``):
``python compile.py SPEC.json OUT.json`` builds once; ``python compile.py --serve`` is a compile
server: each line on its stdin is ``SPEC.json OUT.json`` plus the environment to compile under
(JSON), and it answers each with one line on its stdout once OUT is written (anything Triton
prints goes to its stderr). It stops at the end of its input.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys


# Triton options of every emitted kernel besides ``num_warps``: programmatic dependent launch (the
# roles wait on the previous grid before touching global memory: ``emit``); Triton's C launcher
# reads it from the compiled kernel's metadata
OPTIONS = {"launch_pdl": True}


class _Scalar:
    """A scalar parameter's place in the argument tuple, carrying its Triton type."""

    def __init__(self, type_name: str):
        self.type_name = type_name


def _compile(spec: dict) -> dict:
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    loader = importlib.util.spec_from_file_location("tilews_gluon_compile", spec["source"])
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    fn = getattr(module, spec["fn"])
    values = []
    for p in spec["params"]:
        if p["kind"] == "scalar":
            values.append(_Scalar(p["type"]))
        else:
            shape = p["shape"]
            strides = [1] * len(shape)
            for d in range(len(shape) - 2, -1, -1):
                strides[d] = strides[d + 1] * shape[d + 1]
            values.append(torch.empty_strided(shape, strides, dtype=getattr(torch, p["dtype"]),
                                              device="meta"))
    flat = getattr(module, spec["args_fn"])(*values)
    signature = {name: v.type_name if isinstance(v, _Scalar) else mangle_type(v)
                 for name, v in zip(fn.arg_names, flat)}
    # the specialization Triton's JIT gives contiguous, 16-byte aligned tensors at launch (the
    # kernel that runs): pointers and strides divisible by 16 hinted so, strides of 1 constants
    attrs, constants = {}, {}
    for i, v in enumerate(flat):
        if isinstance(v, torch.Tensor) or isinstance(v, int) and v % 16 == 0:
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, int) and v == 1:
            constants[(i,)] = 1
            signature[fn.arg_names[i]] = "constexpr"
    from tilews.triton_ext import passes as ttgir_passes
    # our TTGIR passes (the warp-specialization and FP8 verifiers) run in this compile, with the
    # FP8 promotion interval (it also names the Triton cache folder)
    with ttgir_passes.checking(int(spec.get("fp8_promote_every", 0))):
        compiled = triton.compile(GluonASTSource(fn, signature, constants, attrs),
                                  target=GPUTarget(*spec["target"]),
                                  options={"num_warps": spec["num_warps"], **OPTIONS})
    meta = compiled.metadata
    return {"asm": {k: v for k, v in compiled.asm.items() if isinstance(v, str)},
            "metadata": {"name": meta.name, "num_warps": meta.num_warps, "shared": meta.shared,
                         "launch_pdl": meta.launch_pdl, "triton_version": triton.__version__}}


def build(spec: dict) -> dict:
    """The stages and metadata of ``spec``'s kernel, or the TTGIR verifier's finding."""
    from tilews.lowering.errors import CompileError
    try:
        return _compile(spec)
    except CompileError as e:   # the TTGIR verifier's finding: reported to the user, not a crash
        return {"verifier_error": e.message, "notes": list(e.notes)}


def _build_file(spec_path: str, out_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    result = build(spec)
    with open(out_path, "w") as f:
        json.dump(result, f)


def serve(requests, answers) -> None:
    """Build each request read from ``requests`` under its environment; a line on ``answers``
    after each."""
    for line in requests:
        spec_path, out_path, env = json.loads(line)
        os.environ.clear()
        os.environ.update(env)
        _build_file(spec_path, out_path)
        answers.write("done\n")
        answers.flush()


def main(argv: list[str]) -> int:
    if argv == ["--serve"]:
        answers = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)          # what Triton prints goes to stderr, never into the answers
        serve(sys.stdin, answers)
    else:
        _build_file(*argv)
    return 0


if __name__ == "__main__":
    # run by path: this folder is sys.path[0]; keep its modules (emit, launch, ...) from shadowing
    # anything torch or triton imports
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    sys.exit(main(sys.argv[1:]))
