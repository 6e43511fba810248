"""Each backend's pipeline: the one place its passes and their order are written, shown in
docs/design.md §5 (checked here), and the config a pass reads (``BackendConfig``)."""
from __future__ import annotations

import pkgutil
import re
from pathlib import Path

import pytest

import tilews.language as T
from tilews import backends
from tilews.lowering import passes
from tilews.lowering.frontend import build_kernel
from tilews.lowering.pipeline import lower
from tilews.triton_ext.gluon.backend import HOPPER

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"
BEGIN, END = "<!-- pipelines: begin -->", "<!-- pipelines: end -->"


def pipelines_table() -> str:
    """The pipelines of every backend as docs/design.md shows them."""
    targets = {name: [t for t, chain in backends.CHAINS.items() if name in chain]
               for name in backends.BACKENDS}
    rows = ["| backend (targets) | phase | passes |", "|---|---|---|"]
    for name in backends.BACKENDS:
        cls = backends.backend_class(name)
        serves = ", ".join(f"`{t}`" for t in targets[name])
        for n, phase in enumerate(cls.pipeline.phases):
            head = f"{name} ({serves})" if n == 0 else ""
            rows.append(f"| {head} | {phase.name} | {', '.join(f'`{p.name}`' for p in phase.passes)} |")
    return "\n".join(rows)


def test_design_doc_shows_every_pipeline():
    text = DESIGN.read_text()
    shown = text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip()
    assert shown == pipelines_table(), (
        f"docs/design.md §5 differs from the pipelines in the code; put this between {BEGIN} and "
        f"{END}:\n{pipelines_table()}")


def test_every_pass_is_in_a_pipeline_and_described():
    modules = {m.name for m in pkgutil.iter_modules(passes.__path__)}
    used = {p for name in backends.BACKENDS for p in backends.backend_class(name).pipeline.pass_names}
    assert used == modules
    section = DESIGN.read_text().split("## §5")[1].split("\n## ")[0]
    described = set(re.findall(r"^\d+\. `(\w+)` —", section, re.M))
    assert described == modules, sorted(modules - described)


def test_a_pass_runs_once_per_pipeline():
    for name in backends.BACKENDS:
        names = backends.backend_class(name).pipeline.pass_names
        assert len(names) == len(set(names)), name


def test_config_replace_routes_each_field_to_its_part():
    c = HOPPER.replace(num_sms=4, pingpong=True, fast_math=True)
    assert (c.caps.num_sms, c.policy.pingpong, c.codegen.fast_math) == (4, True, True)
    assert (HOPPER.caps.num_sms, HOPPER.policy.pingpong, HOPPER.codegen.fast_math) == (0, False, False)
    assert c.pipeline is HOPPER.pipeline and c.name == "hopper"
    with pytest.raises(TypeError, match="no field warp_specialised"):
        HOPPER.replace(warp_specialised=True)


def test_configure_is_where_settings_and_pass_configs_enter():
    from tilews.lowering.backend import Machine, Services
    from tilews.lowering.settings import Settings
    from tilews.pass_config import resolve
    services = Services(store=None, settings=Settings(overlap_softmax=False), machine=Machine(num_sms=78))
    config = backends.configure(backends.backend_class("gluon"), services,
                                resolve({"tl.enable_fast_math": True}))
    assert (config.caps.num_sms, config.policy.overlap_softmax, config.codegen.fast_math) == (78, False, True)
    assert config.pipeline is backends.backend_class("gluon").pipeline
    tl = backends.configure(backends.backend_class("tl"), services)
    assert tl.caps.triton_interpreter and tl.caps.num_sms == 0


def test_stopping_at_a_pass_the_pipeline_lacks_is_an_error():
    @T.prim_func
    def main(X: T.Tensor((64,), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(64):
                X[i] = X[i] + 1.0
    with pytest.raises(ValueError, match="has no pass 'insert_syncs'"):
        lower(build_kernel(main), HOPPER, upto="insert_syncs")
