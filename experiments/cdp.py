"""The CDP content-word rule on the collections in ``../shared/data``: the queries' mean content-word count (CW)
and what the rule advises (diverse synthetic queries below CW 7: avoid; above CW 10: use).

    python experiments/cdp.py

Writes ``experiments/results/cdp_content_words.{csv,md,png}``.
"""
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd

from pyterrier_multiquery import load_dataset
from pyterrier_multiquery.cdp import (AVOID_DIVERSITY_BELOW, USE_DIVERSITY_ABOVE, content_words, diversity_advice)
from pyterrier_multiquery.experiment import default_data_dir

matplotlib.use('Agg')
RESULTS = Path(__file__).parent / 'results'
COLLECTIONS = {'SciFact (test)': ('scifact', 'test'), 'SciFact (train)': ('scifact', 'train'),
               'Vaswani': ('vaswani', None), 'RAMDocs': ('ramdocs', None), 'MuSiQue': ('musique', None)}


def main():
    import matplotlib.pyplot as plt
    data_dir = default_data_dir()
    rows, counts = [], {}
    for name, (folder, variant) in COLLECTIONS.items():
        topics = load_dataset(str(data_dir / folder)).get_topics(variant)
        cw = np.array([len(content_words(q)) for q in topics['query']])
        counts[name] = cw
        rows.append({'collection': name, 'queries': len(cw), 'CW mean': cw.mean(), 'CW median': float(np.median(cw)),
                     'words mean': np.mean([len(q.split()) for q in topics['query']]), 'advice': diversity_advice(cw.mean())})
    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format='%.2f'))
    RESULTS.mkdir(exist_ok=True)
    table.to_csv(RESULTS / 'cdp_content_words.csv', index=False)
    (RESULTS / 'cdp_content_words.md').write_text('# Content words (CW) of each collection\'s queries\n\n'
                                                  + table.to_markdown(index=False, floatfmt='.2f') + '\n')
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.boxplot(list(counts.values()), tick_labels=list(counts), orientation='horizontal')
    ax.axvspan(0, AVOID_DIVERSITY_BELOW, color='tab:red', alpha=0.1, label='avoid diversity (CW < 7)')
    ax.axvspan(USE_DIVERSITY_ABOVE, max(c.max() for c in counts.values()) + 1, color='tab:green', alpha=0.1,
               label='use diversity (CW > 10)')
    ax.set_xlabel('content words per query')
    ax.legend(loc='lower center', bbox_to_anchor=(0.5, 1.0), ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(RESULTS / 'cdp_content_words.png', dpi=120)


if __name__ == '__main__':
    main()
