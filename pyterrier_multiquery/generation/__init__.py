"""One interface for the LLM calls of query generation, QAEncoder, CDP and query expansion."""
from pyterrier_multiquery.generation.base import CachedGenerator, GenerationError, TextGenerator
from pyterrier_multiquery.generation.huggingface import HuggingFaceGenerator
from pyterrier_multiquery.generation.openai_compatible import OpenAICompatibleGenerator
from pyterrier_multiquery.generation.parsing import parse_queries
from pyterrier_multiquery.generation.query_transformers import (AMER_KEYWORD_PROMPT, QUERY_PROMPTS, KeywordExpansion,
                                                                QueryGenerator)

__all__ = ['TextGenerator', 'CachedGenerator', 'GenerationError', 'HuggingFaceGenerator',
           'OpenAICompatibleGenerator', 'parse_queries', 'QueryGenerator', 'KeywordExpansion', 'QUERY_PROMPTS',
           'AMER_KEYWORD_PROMPT']
