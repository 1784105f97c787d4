"""The core runs without pyterrier-pisa (the [pisa] extra, wheels for Linux only): a fresh interpreter where importing
it fails, as where it is not installed, imports the package and searches a dense index; BM25 through PISA then fails
naming the extra."""
import json
import subprocess
import sys

PISA_BLOCKED = '''
import json, sys
sys.modules['pyterrier_pisa'] = None  # any import of it now raises ModuleNotFoundError, as when not installed
import numpy as np
import pandas as pd
import pyterrier_multiquery as pm

index = pm.MultiVectorIndex(sys.argv[1], verbose=False).index([
    {'docno': 'd0', 'doc_embs': np.array([[1., 0.], [0., 1.]], dtype=np.float32)},
    {'docno': 'd1', 'doc_embs': np.array([[0.6, 0.8]], dtype=np.float32)}])
query = pd.DataFrame({'qid': ['q1'], 'query_embs': [np.array([[1., 0.], [0., 1.]], dtype=np.float32)]})
run = index.retriever()(query)
try:
    pm.bm25(sys.argv[1] + '.pisa', lambda: [{'docno': 'd0', 'text': 'a'}])
    error = None
except ModuleNotFoundError as e:
    error = str(e)
print(json.dumps({'run': run[['docno', 'score', 'rank']].to_dict('records'), 'error': error,
                  'pisa_loaded': sys.modules['pyterrier_pisa'] is not None}))
'''


def test_core_imports_and_searches_a_dense_index_without_pyterrier_pisa(tmp_path):
    done = subprocess.run([sys.executable, '-c', PISA_BLOCKED, str(tmp_path / 'docs.mvi')], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # MaxSim, mean over the query's two vectors: d0 matches each exactly (1 and 1), d1 gives 0.6 and 0.8
    assert [r['docno'] for r in result['run']] == ['d0', 'd1']
    assert [round(r['score'], 6) for r in result['run']] == [1.0, 0.7]
    assert [r['rank'] for r in result['run']] == [0, 1]
    assert result['error'].startswith("'pyterrier_pisa' is not installed: this feature needs pyterrier-multiquery's "
                                      "[pisa] extra (pip install 'pyterrier-multiquery[pisa]')")
    assert result['pisa_loaded'] is False
    assert not (tmp_path / 'docs.mvi.pisa').exists()
