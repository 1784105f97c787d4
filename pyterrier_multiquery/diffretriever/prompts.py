"""The retrieval prompts (Table 1 of the paper, PromptReps' wording) and the layout of the K mask positions."""
from typing import List, Tuple

_INSTRUCTION = ('{kind}: "{text}". Use {amount} to represent the {noun} in a retrieval task. '
                'Make sure your {unit} in lowercase.')


def instruction(k: int, side: str) -> Tuple[str, str, str]:
    """The user instruction split where the text goes, and the assistant prefix, for ``k`` positions.

    "one word" for ``k == 1`` and "a few words" for ``k > 1``; ``side`` is ``'query'`` or ``'doc'``.

    Returns:
        ``(before_text, after_text, assistant_prefix)`` with ``before_text + text + after_text`` the instruction.
    """
    if side not in ('query', 'doc'):
        raise ValueError(f"side must be 'query' or 'doc', got {side!r}")
    if k < 1:
        raise ValueError(f'k must be at least 1, got {k}')
    kind, noun = ('Query', 'query') if side == 'query' else ('Passage', 'passage')
    amount, unit, prefix = ('one word', 'word is', 'The word is: "') if k == 1 else \
        ('a few words', 'words are', 'The words are: "')
    full = _INSTRUCTION.format(kind=kind, text='\0', amount=amount, noun=noun, unit=unit)
    before, after = full.split('\0')
    return before, after, prefix


def prompt_ids(tokenizer, text_ids: List[int], k: int, side: str) -> List[int]:
    """Token ids of the instruction around ``text_ids`` followed by the assistant prefix, as the user turn of the
    tokenizer's chat template when it has one (no special tokens otherwise)."""
    before, after = prompt_parts(tokenizer, k, side)
    return before + text_ids + after


def prompt_parts(tokenizer, k: int, side: str) -> Tuple[List[int], List[int]]:
    """The token ids :func:`prompt_ids` puts before and after the text."""
    before, after, prefix = instruction(k, side)

    def encode(s: str) -> List[int]:
        return tokenizer(s, add_special_tokens=False)['input_ids']

    if getattr(tokenizer, 'chat_template', None):
        marker = '\0TEXT\0'
        rendered = tokenizer.apply_chat_template([{'role': 'user', 'content': before + marker + after}],
                                                 tokenize=False, add_generation_prompt=True)
        head, tail = rendered.split(marker)
        return encode(head), encode(tail + prefix)
    return encode(before), encode(after + ' ' + prefix)


def layout(tokenizer, text_ids: List[int], k: int, side: str, mask_id: int) -> Tuple[List[int], List[int], int]:
    """Token ids of the prompt around ``text_ids`` with ``k`` mask positions, the indexes of those positions, and
    the index of the text's first token.

    With a chat template (LLaDA, Dream, DiffusionGemma, any instruct model) the instruction is the user turn and the
    masks follow the assistant prefix, closed by the quote and by what the template ends an assistant turn with
    (and EOS). Without one (BERT-like masked LMs, ModernBERT) the layout is the tokenizer's own specials around
    ``instruction assistant_prefix <mask>*k "`` (``[CLS] ... [SEP]`` for BERT).
    """
    before, after = prompt_parts(tokenizer, k, side)
    ids = before + text_ids + after
    quote = tokenizer('"', add_special_tokens=False)['input_ids']
    if getattr(tokenizer, 'chat_template', None):
        return ids + [mask_id] * k + quote + _turn_end(tokenizer), list(range(len(ids), len(ids) + k)), len(before)
    head, tail = _specials(tokenizer)
    start = len(head) + len(ids)
    return head + ids + [mask_id] * k + quote + tail, list(range(start, start + k)), len(head) + len(before)


def _specials(tokenizer) -> Tuple[List[int], List[int]]:
    """The special tokens the tokenizer puts before and after a sequence (``[CLS]`` and ``[SEP]`` for BERT)."""
    bare = tokenizer('retrieval', add_special_tokens=False)['input_ids']
    full = tokenizer('retrieval')['input_ids']
    start = next(i for i in range(len(full) - len(bare) + 1) if full[i:i + len(bare)] == bare)
    return full[:start], full[start + len(bare):]


def _turn_end(tokenizer) -> List[int]:
    """What the chat template puts after the content of an assistant turn (its end-of-turn token: ``<|im_end|>``,
    ``<|eot_id|>``, ``<end_of_turn>``, ...), then the EOS token when that is not already among them."""
    marker = '\0END\0'
    rendered = tokenizer.apply_chat_template([{'role': 'user', 'content': 'x'},
                                              {'role': 'assistant', 'content': marker}], tokenize=False)
    ids = tokenizer(rendered.split(marker)[-1].strip(), add_special_tokens=False)['input_ids']
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids
