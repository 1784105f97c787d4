"""DiffRetriever (seed 004): K mask positions read in one bidirectional pass give K dense and one sparse
representation per text; with the DiffEmbed and PromptReps baselines, hybrid fusion, fine-tuning and the
budget analysis."""
from pyterrier_multiquery.diffretriever.reference_encoders import DiffEmbed, PromptReps
from pyterrier_multiquery.diffretriever.budget import (budget_grid, grid_means, oracle_budgets, oracle_correlations,
                                                      query_features, select_budget)
from pyterrier_multiquery.diffretriever.encoder import DiffRetriever
from pyterrier_multiquery.diffretriever.fusion import HybridRetriever
from pyterrier_multiquery.diffretriever.pipelines import MODES, retrieval_pipelines
from pyterrier_multiquery.diffretriever.sparse import lucene_sparse_index, sparse_index
from pyterrier_multiquery.diffretriever.training import DiffRetrieverTrainer

__all__ = ['DiffRetriever', 'DiffEmbed', 'PromptReps', 'HybridRetriever', 'retrieval_pipelines', 'MODES',
           'DiffRetrieverTrainer', 'budget_grid', 'select_budget', 'grid_means', 'query_features', 'oracle_budgets',
           'oracle_correlations', 'sparse_index', 'lucene_sparse_index']
