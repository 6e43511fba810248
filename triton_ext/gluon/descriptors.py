"""TMA descriptors cached per (address, shape, strides, dtype, block, layout).

A Gluon kernel's host argument function makes one ``TensorDescriptor`` per bulk-copied tensor
and tile shape (``emit.DESCRIPTOR_FN``); building one validates the tensor again (~2 us). A
``DescriptorCache`` installed on the loaded module answers repeated calls with the descriptor
made the first time. The cached descriptor refers to the tensor's memory through an ``Address``
(its data pointer and dtype: all Triton's launcher reads of the base), never the tensor itself,
so the cache keeps no tensor alive. Entries are bounded (least recently made go first).

A ``DescriptorSite`` serves the launches of one call signature (``launch.GluonProgram.bound_launch``),
whose tensors' shapes, strides and dtypes are fixed: it keeps one descriptor site's expansion for
Triton's C launcher (the encoded tensor map, shape and strides) per tensor address.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class Address:
    """Where a descriptor's tensor starts, standing in for the tensor as a descriptor's base."""
    ptr: int
    dtype: object

    def data_ptr(self) -> int:
        return self.ptr


class DescriptorCache:
    def __init__(self, make, capacity: int = 64):
        self.make = make                   # TensorDescriptor.from_tensor
        self.capacity = capacity
        self.entries: OrderedDict = OrderedDict()

    def __call__(self, tensor, block_shape, layout):
        key = (tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype, tuple(block_shape), id(layout))
        desc = self.entries.get(key)
        if desc is None:
            desc = self.entries[key] = addressed(self.make, tensor, block_shape, layout)
            if len(self.entries) > self.capacity:
                self.entries.popitem(last=False)
        return desc


def addressed(make, tensor, block_shape, layout):
    """``make(tensor, block_shape, layout)`` (which validates the tensor), its base an ``Address``."""
    made = make(tensor, block_shape, layout)
    return type(made)(Address(tensor.data_ptr(), tensor.dtype), made.shape, made.strides,
                      made.block_shape, made.layout, made.padding)


class DescriptorSite:
    """One descriptor site's expansions for Triton's C launcher, per tensor address, for tensors of
    one shape, strides and dtype (the caller's call signature): ``site(tensor)`` is the list the
    launcher's descriptor wrapper would make of ``make(tensor, block, layout)`` (``encode`` of the
    descriptor). At most ``capacity`` addresses (then it starts over)."""

    def __init__(self, make, block_shape, layout, encode, capacity: int = 64):
        self.make, self.block_shape, self.layout, self.encode = make, block_shape, layout, encode
        self.capacity = capacity
        self.entries: dict = {}

    def __call__(self, tensor) -> list:
        expansion = self.entries.get(tensor.data_ptr())
        if expansion is None:
            if len(self.entries) >= self.capacity:
                self.entries.clear()
            expansion = self.entries[tensor.data_ptr()] = self.encode(
                addressed(self.make, tensor, self.block_shape, self.layout))
        return expansion
