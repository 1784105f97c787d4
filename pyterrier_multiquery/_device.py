"""Choosing the torch device."""
from typing import Optional


def resolve_device(device: Optional[str] = None) -> str:
    """``device``, or CUDA when torch sees a GPU and the CPU otherwise (also when torch is not installed: the
    component that needs it then says which extra installs it)."""
    if device is not None:
        return device
    try:
        import torch
    except ModuleNotFoundError:
        return 'cpu'
    return 'cuda' if torch.cuda.is_available() else 'cpu'
