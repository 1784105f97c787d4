import pandas as pd
import pyterrier as pt
import pytest

from pyterrier_multiquery.generation import TextGenerator
from pyterrier_multiquery.generation.query_transformers import AMER_KEYWORD_PROMPT, KeywordExpansion, QueryGenerator


class ScriptedGenerator(TextGenerator):
    """Answers each prompt with the first scripted answer whose key occurs in it."""
    model_id = 'scripted'

    def __init__(self, answers):
        self.answers = answers
        self.prompts = []

    def _generate(self, prompts):
        self.prompts.extend(p[-1]['content'] for p in prompts)
        return [next(a for k, a in self.answers.items() if k in p[-1]['content']) for p in prompts]


def test_query_generator_writes_parsed_query_lists():
    generator = ScriptedGenerator({
        'moon': 'Here are the questions:\n1. Who landed on the moon?\n2. When was Apollo 11?\n'
                '3. Who landed on the moon?\n4. Why?',
        'gravity': '["What is general relativity?", "Who explained gravity?"]',
    })
    docs = pd.DataFrame({'docno': ['d1', 'd2'], 'text': ['Armstrong landed on the moon.', 'Einstein on {gravity}.']})
    out = QueryGenerator(generator, 'diverse', num_queries=3)(docs)
    assert out['querygen'].tolist() == [['Who landed on the moon?', 'When was Apollo 11?', 'Why?'],
                                        ['What is general relativity?', 'Who explained gravity?']]
    assert 'Armstrong landed on the moon.' in generator.prompts[0] and '3 search queries' in generator.prompts[0]
    assert 'Einstein on {gravity}.' in generator.prompts[1]  # braces in a document are not format fields


def test_query_generator_rejects_bad_settings():
    with pytest.raises(ValueError, match='5w1h'):
        QueryGenerator(ScriptedGenerator({}), 'no such prompt')
    with pytest.raises(ValueError, match='num_queries'):
        QueryGenerator(ScriptedGenerator({}), num_queries=0)
    with pytest.raises(pt.validate.InputValidationError, match=r"\['text'\]"):
        QueryGenerator(ScriptedGenerator({}))(pd.DataFrame({'docno': ['d1']}))
    with pytest.raises(ValueError, match=r"placeholder other than \{text\} .*KeyError\('\"q\"'\).*literal braces"):
        QueryGenerator(ScriptedGenerator({}), 'Answer as {"q": [...]}: {text}')
    with pytest.raises(ValueError, match="'text' is missing or not a string for docno 'd2' \\(1 rows\\)"):
        QueryGenerator(ScriptedGenerator({}))(pd.DataFrame({'docno': ['d1', 'd2'], 'text': ['a', None]}))


def test_keyword_expansion_appends_keywords_and_keeps_the_original():
    generator = ScriptedGenerator({'Jaguar': 'car maker, big cat,  football team, big cat',
                                   'Mercury': 'Keywords:\n- planet\n- element'})
    topics = pd.DataFrame({'qid': ['1', '2'], 'query': ['what is Jaguar', 'what is Mercury']})
    out = KeywordExpansion(generator)(topics)
    assert out['query'].tolist() == ['what is Jaguar car maker big cat football team', 'what is Mercury planet element']
    assert out['query_0'].tolist() == topics['query'].tolist()
    assert generator.prompts[0] == AMER_KEYWORD_PROMPT.replace('[Question]', 'what is Jaguar')
    assert KeywordExpansion(generator, max_keywords=1)(topics.iloc[:1])['query'][0] == 'what is Jaguar car maker'
    empty = KeywordExpansion(generator)(topics.iloc[:0])
    assert len(empty) == 0 and {'query', 'query_0'} <= set(empty.columns)


def test_keyword_expansion_needs_queries_and_a_placeholder():
    with pytest.raises(ValueError, match=r'\[Question\]'):
        KeywordExpansion(ScriptedGenerator({}), prompt='keywords please')
    with pytest.raises(pt.validate.InputValidationError, match=r"\['query'\]"):
        KeywordExpansion(ScriptedGenerator({}))(pd.DataFrame({'qid': ['1']}))
    with pytest.raises(ValueError, match='max_keywords must be at least 1, got 0'):
        KeywordExpansion(ScriptedGenerator({}), max_keywords=0)
