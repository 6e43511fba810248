"""What a tuning run produces: one ``Trial`` per configuration and the ``AutotuneResult``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional


@dataclass
class Trial:
    """One configuration's outcome: its kernel and latency in ms, or why it was dropped."""
    config: dict
    kernel: Any = None
    latency: Optional[float] = None
    failure: Optional[str] = None

    def describe(self) -> str:
        if self.failure is not None:
            return f"{self.config}: {self.failure}"
        return f"{self.config}: {self.latency:.4g} ms"


@dataclass(frozen=True)
class AutotuneResult:
    """The best configuration and its kernel (TileLang's fields: ``libcode`` is the generated
    source, ``func`` the kernel's frontend IR). ``latency``/``ref_latency`` are in ms; both are
    ``None`` when tuning was bypassed."""
    latency: Optional[float] = None
    config: Optional[dict] = None
    ref_latency: Optional[float] = None
    libcode: Optional[str] = None
    func: Any = None
    kernel: Optional[Callable] = None

    @classmethod
    def of(cls, kernel) -> "AutotuneResult":
        """The result describing ``kernel`` (whose ``.latency``/``.config``/``.ref_latency`` the
        tuner has set)."""
        return cls(latency=kernel.latency, config=kernel.config, ref_latency=kernel.ref_latency,
                   libcode=kernel.get_kernel_source(), func=kernel.ir_before, kernel=kernel)
