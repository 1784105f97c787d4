"""LoRA adapters on a DiffRetriever backbone, and their merge back into plain weights.

A backbone may run one weight through two modules: DiffusionGemma's prompt encoder and canvas decoder share every
layer weight. peft gives each module its own adapter, which would train the two halves apart and merge both deltas
into the one shared weight. So the modules that share a weight are made one module before the adapters go on (one
adapter, applied wherever the weight is), and again after the merge (peft unloads a shared module under one name).
"""
from pyterrier_multiquery._extras import requires

#: The paper's LoRA settings: rank 16, alpha 64, on every linear projection of the attention and MLP blocks.
LORA_R, LORA_ALPHA = 16, 64


def add_lora(backbone, *, r: int = LORA_R, alpha: int = LORA_ALPHA, dropout: float = 0.05) -> None:
    """Wraps the backbone's model with peft LoRA adapters on all its linear layers but the vocabulary head."""
    with requires('train'):
        from peft import LoraConfig, get_peft_model
    share_tied_modules(backbone.model)
    backbone.model = get_peft_model(backbone.model, LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout,
                                                               target_modules='all-linear'))
    share_tied_modules(backbone.model, wrapped=True)


def merge_lora(model):
    """``model`` with its LoRA adapters merged into its weights and removed (``model`` itself when it has none)."""
    if not hasattr(model, 'merge_and_unload'):
        return model
    model = model.merge_and_unload()
    share_tied_modules(model)
    return model


def share_tied_modules(model, *, wrapped: bool = False) -> None:
    """Makes the leaf modules of ``model`` that are of one kind and hold the very same parameters one module: every
    parent of such a module is pointed at the same one, an adapter-wrapped one (a module with a ``base_layer``)
    when ``wrapped``, a plain one otherwise, or else the first found."""
    def base(module):
        return getattr(module, 'base_layer', module)

    groups = {}
    for parent in model.modules():
        if hasattr(parent, 'base_layer'):  # an adapter wrapper keeps the module it wraps
            continue
        for name, child in parent.named_children():
            leaf = base(child)
            params = tuple(id(p) for p in leaf.parameters())
            if params and next(leaf.children(), None) is None:
                groups.setdefault((type(leaf), params), []).append((parent, name, child))
    for group in groups.values():
        kept = next((child for _, _, child in group if hasattr(child, 'base_layer') == wrapped), group[0][2])
        for parent, name, child in group:
            if child is not kept:
                setattr(parent, name, kept)
