"""AMER (Autoregressive Multi-Embedding Retriever): model, trainer and query encoder.

torch and transformers load only with the classes that need them.
"""
from pyterrier_multiquery._lazy import lazy_getattr

_ATTRIBUTES = {
    'AMER': 'model',
    'EncoderAMER': 'encoder_model',
    'LinearResidualAMER': 'encoder_model',
    'AMERTrainer': 'training',
    'AMERQueryEncoder': 'pipeline',
}

__all__ = list(_ATTRIBUTES)


__getattr__ = lazy_getattr(__name__, _ATTRIBUTES, globals())
