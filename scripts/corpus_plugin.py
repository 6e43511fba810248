"""A pytest plugin that records what every compile lowers and emits, to check that a refactor
changes no generated code.

Each (frontend IR, backend) pair ``tilews.compiler`` lowers is written to
``$CORPUS_OUT/<digest>.<backend>.txt``: the lowered IR, then the generated source, then the
refusal (if the backend refused). The digest is of the backend's name and the printed frontend
IR (locations take no part), so the same program gives the same file name under two checkouts.
Record with the disk cache off (a hit skips lowering), under each checkout, then compare:

    cd <checkout> && PYTHONPATH=<this folder> CORPUS_OUT=/tmp/corpus/<name> TILEWS_DISABLE_CACHE=1 \\
        python -m pytest -q -n 0 -p corpus_plugin tests/test_generated_source.py tests/tilelang_compat ...
    diff -r /tmp/corpus/before /tmp/corpus/after

Line numbers in ``# tilews: file.py:LINE`` comments move when a cited source file gains lines.
"""
from __future__ import annotations

import hashlib
import os


def pytest_configure(config):
    from tilews import compiler
    from tilews.lowering import printer
    lower = compiler._lower
    out = os.environ["CORPUS_OUT"]
    os.makedirs(out, exist_ok=True)

    def recording(backend, kernel, *rest):
        lowered = lower(backend, kernel, *rest)
        digest = hashlib.sha256((backend.name + printer.to_text(kernel)).encode()).hexdigest()[:20]
        with open(os.path.join(out, f"{digest}.{backend.name}.txt"), "w") as f:
            f.write(f"{printer.to_text(lowered.ir_after)}\n=====\n{lowered.source}\n=====\n"
                    f"{lowered.refusal}")
        return lowered
    compiler._lower = recording
