"""TileLang's ``tilelang.env`` as far as programs reach it: the on-disk cache's directory and its
switch (``env.TILELANG_CACHE_DIR``, ``env.is_cache_enabled()``, ``env.disable_cache()``,
``env.enable_cache()``; also as module attributes, ``tilews.env.TILELANG_CACHE_DIR``).

The switch is the environment (``lowering/settings.py`` owns it and reads it at each compile), so
turning the cache off here holds for the rest of the process and for its child processes."""
from __future__ import annotations

from tilews import cache
from tilews.lowering import settings


class Environment:
    @property
    def TILELANG_CACHE_DIR(self) -> str:   # noqa: N802  (TileLang's name)
        return str(cache.default_cache_dir())

    def is_cache_enabled(self) -> bool:
        return not cache.cache_disabled()

    def disable_cache(self) -> None:
        settings.set_cache_disabled(True)

    def enable_cache(self) -> None:
        settings.set_cache_disabled(False)


env = Environment()


def __getattr__(name: str):
    return getattr(env, name)
