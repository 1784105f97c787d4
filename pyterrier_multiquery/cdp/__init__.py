"""The Complexity-Diversity Principle (Feng et al., 2026): the content-word rule for when diverse synthetic queries
help a dense retriever, the quality/diversity metrics of synthetic queries, and training a bi-encoder on them."""
from pyterrier_multiquery.cdp.complexity import (AVOID_DIVERSITY_BELOW, USE_DIVERSITY_ABOVE, complexity_regression,
                                                 condition_correlations, content_word_count, content_words,
                                                 diversity_advice)
from pyterrier_multiquery.cdp.quality_diversity import dist_sim, len_sim, paraphrase_ratio, self_bleu

__all__ = ['AVOID_DIVERSITY_BELOW', 'USE_DIVERSITY_ABOVE', 'content_words', 'content_word_count', 'diversity_advice',
           'complexity_regression', 'condition_correlations', 'self_bleu', 'paraphrase_ratio', 'dist_sim', 'len_sim']
