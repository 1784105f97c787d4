"""Choosing the torch device."""
from typing import Optional


def resolve_device(device: Optional[str] = None) -> str:
    """``device``, or CUDA when torch sees a GPU and the CPU otherwise."""
    if device is not None:
        return device
    import torch
    return 'cuda' if torch.cuda.is_available() else 'cpu'
