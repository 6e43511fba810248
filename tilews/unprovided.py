"""TileLang modules tilews does not provide, as stand-ins that import (``tilews.cuda``,
``tilews.rocm``): a program that only imports a name from them runs; using the name (calling it,
reading an attribute of it, subclassing it) raises ``NotProvided`` saying what it is and why
tilews lacks it. ``stub_package`` makes a package's every submodule such a stand-in."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


class NotProvided(AttributeError):
    """A TileLang name tilews does not provide."""


class Unprovided:
    """A name of a stand-in module: any use raises ``NotProvided``."""

    def __init__(self, qualname: str, reason: str):
        self._message = f"tilews does not provide TileLang's {qualname}: {reason}"

    def _fail(self, *_args, **_kwargs):
        raise NotProvided(self._message)

    __call__ = __getitem__ = _fail

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        self._fail()

    def __mro_entries__(self, bases):
        self._fail()

    def __repr__(self) -> str:
        return f"<{self._message}>"


def _tilelang_name(module: str) -> str:
    return "tilelang" + module[len("tilews"):]


class _StubModule(types.ModuleType):
    def __init__(self, name: str, reason: str):
        super().__init__(name, f"stand-in for TileLang's {_tilelang_name(name)}: {reason}")
        self.__path__ = []          # a package: its submodules are stand-ins too
        self._reason = reason

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return Unprovided(f"{_tilelang_name(self.__name__)}.{name}", self._reason)


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, package: str, reason: str):
        self.package, self.reason = package, reason

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(self.package + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _StubModule(spec.name, self.reason)

    def exec_module(self, module):
        pass


def stub_package(package: str, reason: str):
    """Serve every submodule of ``package`` as a stand-in; the ``__getattr__`` for the package's
    own names."""
    if not any(isinstance(f, _StubFinder) and f.package == package for f in sys.meta_path):
        sys.meta_path.append(_StubFinder(package, reason))

    def names(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return Unprovided(f"{_tilelang_name(package)}.{name}", reason)
    return names
