"""Where generated tensors live: the current CUDA device on a machine with one, else the CPU."""
from __future__ import annotations

import torch


def best_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
