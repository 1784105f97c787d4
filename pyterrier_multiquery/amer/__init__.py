"""AMER (Autoregressive Multi-Embedding Retriever): model, trainer and query encoder.

torch and transformers load only with the classes that need them.
"""
from pyterrier_multiquery._lazy import lazy_getattr

_ATTRIBUTES = {
    'AMERModel': 'model',
    'EncoderAMERModel': 'encoder_model',
    'LinearResidualAMERModel': 'encoder_model',
    'AMERTrainer': 'training',
    'AMER': 'pipeline',
}

__all__ = list(_ATTRIBUTES)


__getattr__ = lazy_getattr(__name__, _ATTRIBUTES, globals())
