"""Triton backends: ``tl`` (plain triton.language, any Triton target and the CPU interpreter).

Subpackages import Triton lazily, so ``import tilews`` works where Triton is absent.
"""
