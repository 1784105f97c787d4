import json

import pandas as pd
import pytest

import pyterrier_multiquery.loaders as datasets
from pyterrier_multiquery.loaders import (BeirDataset, MusiqueDataset, RamDocsDataset, TrecDataset,
                                           load_dataset)


def corpus(dataset):
    return list(dataset.get_corpus_iter(verbose=False))


def test_ramdocs(data_dir):
    ds = load_dataset(data_dir / 'ramdocs')
    assert isinstance(ds, RamDocsDataset)
    topics, qrels, docs = ds.get_topics(), ds.get_qrels(), corpus(ds)
    assert len(topics) == 500 and len(docs) == 2766 and len({d['docno'] for d in docs}) == 2766
    assert topics.iloc[0].to_dict() == {'qid': '0', 'query': 'What is the population of Broken Bow?'}
    assert len(qrels) == 1918  # one row per passage of type correct
    assert qrels['qid'].nunique() == 497  # three questions have no supporting passage
    # the answer id names the gold answer the passage supports
    questions = [json.loads(line) for line in open(data_dir / 'ramdocs' / 'RAMDocs_test.jsonl')]
    for row in qrels.sample(50, random_state=0).itertuples():
        q, j = row.docno.split('-')
        doc = questions[int(q)]['documents'][int(j)]
        assert row.qid == q and doc['type'] == 'correct'
        assert questions[int(q)]['gold_answers'][int(row.iteration) - 1] == doc['answer']
    answers_per_query = qrels.groupby('qid')['iteration'].nunique()
    assert answers_per_query.max() == 3 and answers_per_query.min() == 1


def test_musique(data_dir):
    ds = load_dataset(data_dir / 'musique')
    assert isinstance(ds, MusiqueDataset)
    topics, qrels, docs = ds.get_topics(), ds.get_qrels(), corpus(ds)
    assert len(topics) == 100 and len(docs) == 1890
    assert len(qrels) == 237  # 68 x 2 + 27 x 3 + 5 x 4 supporting paragraphs
    assert set(qrels.groupby('qid').size()) == {2, 3, 4}
    # each supporting paragraph is its own target
    assert (qrels.groupby('qid')['iteration'].nunique() == qrels.groupby('qid').size()).all()
    # question 0's supporting paragraphs are its paragraphs 6 and 10, found in the corpus by content
    question = json.loads((data_dir / 'musique' / 'musique_train.json').read_text())[0]
    by_docno = {d['docno']: d for d in docs}
    targets = qrels[qrels['qid'] == question['id']]
    assert [by_docno[d]['title'] for d in targets['docno']] == [question['paragraphs'][i]['title'] for i in (6, 10)]
    assert list(targets['iteration']) == ['1', '2']


def test_beir_scifact(data_dir):
    ds = load_dataset(data_dir / 'scifact')
    assert isinstance(ds, BeirDataset)
    assert len(ds.get_topics()) == 300 and len(ds.get_qrels()) == 339
    assert len(ds.get_topics('train')) == 809
    docs = corpus(ds)
    assert len(docs) == 5183
    doc = next(d for d in docs if d['docno'] == '4983')
    assert doc['text'].startswith('Microstructural development of human newborn cerebral white matter') and doc['title']
    with pytest.raises(ValueError, match="no qrels split 'dev'.*'test', 'train'"):
        ds.get_qrels('dev')


def test_a_file_of_another_format_is_not_taken_for_ramdocs(tmp_path, data_dir):
    with pytest.raises(ValueError, match=r"question 1 is not a RAMDocs question .* found \['_id', 'text', 'title'\]"):
        load_dataset(data_dir / 'scifact' / 'corpus.jsonl')     # a BEIR corpus, once a KeyError at get_topics
    (tmp_path / 'q.jsonl').write_text('{"question": "q", "documents": [{"text": "t", "type": "correct", '
                                      '"answer": "a"}], "gold_answers": ["a"]}\n{"question": "r", "documents": '
                                      '[{"text": "t"}], "gold_answers": []}\n')
    with pytest.raises(ValueError, match='question 2 is not a RAMDocs question'):
        load_dataset(tmp_path / 'q.jsonl')


def test_trec_vaswani(data_dir):
    ds = load_dataset(data_dir / 'vaswani')
    assert isinstance(ds, TrecDataset)
    topics, qrels, docs = ds.get_topics(), ds.get_qrels(), corpus(ds)
    assert len(topics) == 93 and len(qrels) == 2083 and len(docs) == 11429
    assert docs[0] == {'docno': '1',
                       'text': 'compact memories have flexible capacities a digital data storage system '
                               'with capacity up to bits and random and or sequential access is described'}
    assert docs[-1]['docno'] == '11429'


def test_trec_parser_across_chunks(tmp_path, monkeypatch):
    docs = [f'<DOC>\n<DOCNO> d{i} </DOCNO>\nword{i} text\n</DOC>\n' for i in range(50)]
    (tmp_path / 'corpus.trec').write_text(''.join(docs))
    (tmp_path / 'topics.trec').write_text('<top>\n<num>1</num><title>\nword3\n</title>\n</top>\n')
    (tmp_path / 'qrels').write_text('1 0 d3 1\n')
    monkeypatch.setattr(datasets, 'TREC_CHUNK_SIZE', 7)  # every <DOC> straddles several reads
    parsed = corpus(TrecDataset(tmp_path))
    assert parsed == [{'docno': f'd{i}', 'text': f'word{i} text'} for i in range(50)]
    assert TrecDataset(tmp_path).get_topics()[['qid', 'query']].to_dict('records') == [{'qid': '1', 'query': 'word3'}]


def test_trec_qrels_keep_their_answer_ids_and_every_document_is_read_or_refused(tmp_path):
    (tmp_path / 'corpus.trec').write_text('<DOC><DOCNO>d1</DOCNO>a</DOC>\n<DOC><DOCID>7</DOCID><DOCNO>d2</DOCNO>b'
                                          '</DOC>\n<DOC><DOCNO>d3</DOCNO>c</DOC>\n')
    (tmp_path / 'topics.trec').write_text('')
    (tmp_path / 'qrels').write_text('1 1 d1 1\n1 2 d1 1\n1 2 d3 1\n2 0 d3 0\n')
    qrels = TrecDataset(tmp_path).get_qrels()
    assert qrels.to_dict('list') == {'qid': ['1', '1', '1', '2'], 'docno': ['d1', 'd1', 'd3', 'd3'],
                                     'label': [1, 1, 1, 0], 'iteration': ['1', '2', '2', '0']}
    with pytest.raises(ValueError, match="whose first element is not <DOCNO>.*'<DOC><DOCID>7"):
        corpus(TrecDataset(tmp_path))  # not d1 and d3 alone
    (tmp_path / 'qrels').write_text('1 0 d1\n')
    with pytest.raises(ValueError, match='line 1 has fewer than 4 fields'):
        TrecDataset(tmp_path).get_qrels()
    (tmp_path / 'qrels').write_text('')
    assert TrecDataset(tmp_path).get_qrels().empty


def test_truncated_trec_corpus_is_an_error(tmp_path):
    (tmp_path / 'corpus.trec').write_text('<DOC><DOCNO>1</DOCNO>a</DOC>\n<DOC><DOCNO>2</DOCNO>b')
    (tmp_path / 'topics.trec').write_text('')
    (tmp_path / 'qrels').write_text('')
    with pytest.raises(ValueError, match='incomplete <DOC>'):
        corpus(TrecDataset(tmp_path))


def test_missing_path_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match='does-not-exist.*does not exist'):
        load_dataset(tmp_path / 'does-not-exist')
    with pytest.raises(ValueError, match='cannot tell what collection'):
        load_dataset(tmp_path)
    (tmp_path / 'corpus.jsonl').write_text('')
    with pytest.raises(FileNotFoundError, match='has no queries.jsonl'):
        load_dataset(tmp_path)


def test_corrupt_jsonl_line_is_named(tmp_path):
    file = tmp_path / 'RAMDocs_x.jsonl'
    file.write_text('{"question": "q", "documents": [], "gold_answers": []}\n{not json\n')
    with pytest.raises(ValueError, match='line 2 is not valid JSON'):
        load_dataset(file)


def test_irds_identifiers_go_to_pyterrier(monkeypatch):
    import pyterrier as pt
    asked = []
    monkeypatch.setattr(pt, 'get_dataset', lambda name: asked.append(name) or 'dataset')
    assert load_dataset('irds:beir/scifact/test') == 'dataset'
    assert asked == ['irds:beir/scifact/test']


def test_topics_and_qrels_frames_have_pyterrier_columns(data_dir):
    ds = load_dataset(data_dir / 'ramdocs')
    assert list(ds.get_topics().columns) == ['qid', 'query']
    assert list(ds.get_qrels().columns) == ['qid', 'docno', 'label', 'iteration']
    assert pd.api.types.is_integer_dtype(ds.get_qrels()['label'])


def test_text_loader_joins_corpus_fields_by_docno(tmp_path):
    import pyterrier as pt
    folder = tmp_path / 'beir'
    (folder / 'qrels').mkdir(parents=True)
    (folder / 'corpus.jsonl').write_text('{"_id": "d1", "title": "T", "text": "one"}\n'
                                         '{"_id": "d2", "title": "", "text": "two"}\n')
    (folder / 'queries.jsonl').write_text('{"_id": "q1", "text": "q"}\n')
    (folder / 'qrels' / 'test.tsv').write_text('query-id\tcorpus-id\tscore\nq1\td1\t1\n')
    ds = load_dataset(folder)
    docs = {d['docno']: d['text'] for d in corpus(ds)}
    stale = pd.DataFrame({'qid': ['q1', 'q1'], 'docno': ['d2', 'd1'], 'text': ['old', 'old']})
    out = pt.text.get_text(ds, 'text')(stale)
    assert out['text'].tolist() == [docs['d2'], docs['d1']]
    with pytest.raises(KeyError, match='d9'):
        ds.text_loader()(pd.DataFrame({'qid': ['q1'], 'docno': ['d9']}))
    with pytest.raises(ValueError, match='no corpus field'):
        ds.text_loader('abstract')(pd.DataFrame({'qid': ['q1'], 'docno': ['d1']}))


def test_combined_dataset_prefixes_each_members_identifiers(data_dir):
    import pyterrier as pt
    from pyterrier_multiquery.experiment.evaluation import training_questions
    from pyterrier_multiquery.loaders import CombinedDataset
    ramdocs, musique = load_dataset(data_dir / 'ramdocs'), load_dataset(data_dir / 'musique')
    both = CombinedDataset([ramdocs, musique])
    topics, qrels, docs = both.get_topics(), both.get_qrels(), corpus(both)
    assert len(topics) == 600 and len(qrels) == 1918 + 237 and len(docs) == 2766 + 1890 == both.corpus_size()
    last = musique.get_topics()['qid'].iloc[-1]
    assert topics['qid'].iloc[0] == 'ramdocs/0' and topics['qid'].iloc[-1] == f'musique/{last}'
    assert docs[2766] == {**corpus(musique)[0], 'docno': 'musique/0'}
    assert set(qrels['docno']) <= {d['docno'] for d in docs}
    assert pt.text.get_text(both, 'text')(qrels.head(1))['text'].iloc[0] == corpus(ramdocs)[0]['text']
    # training on both: each member's fixed training split (60 %), prefixed
    train_topics, train_qrels = training_questions(both)
    assert train_topics['qid'].str.split('/').str[0].value_counts().to_dict() == {'ramdocs': 298, 'musique': 60}
    assert set(train_qrels['qid']) <= set(train_topics['qid'])
    with pytest.raises(ValueError, match='at least two'):
        CombinedDataset([ramdocs])
    with pytest.raises(ValueError, match='no "/"'):
        CombinedDataset({'a/b': ramdocs, 'c': musique})


HOTPOT = [
    {'_id': 'a', 'question': 'Which band did the singer of Q join?', 'answer': 'Queen', 'type': 'bridge',
     'level': 'hard', 'supporting_facts': [['Freddie', 0], ['Queen', 1], ['Freddie', 2]],
     'context': [['Queen', ['Queen is a band.', ' It formed in 1970.']], ['Freddie', ['Freddie sang.']],
                 ['Venus', ['Venus is hot.']]]},
    {'_id': 'b', 'question': 'Is Venus hotter than Mercury?', 'answer': 'yes', 'type': 'comparison',
     'level': 'hard', 'supporting_facts': [['Mercury', 0], ['Venus', 0], ['Pluto', 0]],
     'context': [['Venus', ['Venus is hot.']], ['Mars', ['Mars is red.']]]},
    {'_id': 'c', 'question': 'Where is Mercury?', 'answer': 'near the Sun', 'type': 'bridge', 'level': 'hard',
     'supporting_facts': [['Mercury', 0]], 'context': [['Mercury', ['Mercury is near', ' the Sun.']]]},
]


def hotpot_file(tmp_path, questions, form):
    path = tmp_path / f'questions.{form}'
    path.write_text('\n'.join(json.dumps(q) for q in questions) if form == 'jsonl' else json.dumps(questions))
    return path


@pytest.mark.parametrize('form', ['jsonl', 'json'])
def test_hotpotqa_corpus_topics_and_answers(tmp_path, form):
    path = hotpot_file(tmp_path, HOTPOT, form)
    with pytest.warns(UserWarning, match="1 supporting paragraph.* left out of the qrels; 0 of 3 questions"):
        dataset = load_dataset(path)
        qrels = dataset.get_qrels()
    assert type(dataset).__name__ == 'HotpotQADataset' and dataset.name == 'hotpotqa'
    # every distinct paragraph once, numbered by first appearance ('Venus' appears twice, the same paragraph)
    assert list(dataset.get_corpus_iter(verbose=False)) == [
        {'docno': '0', 'title': 'Queen', 'text': 'Queen Queen is a band. It formed in 1970.'},
        {'docno': '1', 'title': 'Freddie', 'text': 'Freddie Freddie sang.'},
        {'docno': '2', 'title': 'Venus', 'text': 'Venus Venus is hot.'},
        {'docno': '3', 'title': 'Mars', 'text': 'Mars Mars is red.'},
        {'docno': '4', 'title': 'Mercury', 'text': 'Mercury Mercury is near the Sun.'}]
    assert dataset.get_topics().to_dict('records') == [
        {'qid': 'a', 'query': 'Which band did the singer of Q join?'},
        {'qid': 'b', 'query': 'Is Venus hotter than Mercury?'}, {'qid': 'c', 'query': 'Where is Mercury?'}]
    # a: Freddie then Queen (the order of the facts, a title once); b: Mercury from the corpus (c's context has its
    # one paragraph), Venus in its context, Pluto nowhere (left out)
    assert qrels[['qid', 'docno', 'iteration']].values.tolist() == [
        ['a', '1', '1'], ['a', '0', '2'], ['b', '4', '1'], ['b', '2', '2'], ['c', '4', '1']]
    assert (qrels['label'] == 1).all()


def test_2wikimultihopqa_reads_as_hotpotqa(tmp_path):
    questions = [{**q, 'evidences': [['x', 'y', 'z']]} for q in HOTPOT[:1]]
    dataset = load_dataset(hotpot_file(tmp_path, questions, 'json').parent)  # a directory with one file
    assert dataset.name == '2wikimultihopqa'
    assert dataset.get_qrels()['docno'].tolist() == ['1', '0']


def test_a_file_of_another_format_is_refused_by_the_hotpotqa_loader(tmp_path):
    from pyterrier_multiquery.loaders import HotpotQADataset
    path = tmp_path / 'ramdocs.jsonl'
    path.write_text(json.dumps({'question': 'q', 'gold_answers': ['a'], 'documents': []}) + '\n')
    with pytest.raises(ValueError, match=r"question 1 has no \['_id', 'supporting_facts', 'context'\] field"):
        HotpotQADataset(path)
    assert type(load_dataset(path)).__name__ == 'RamDocsDataset'  # what load_dataset makes of it


def test_the_shared_hotpotqa_copy(data_dir):
    # the copy's contexts lack 427 of its 1,000 supporting paragraphs (no other context holds them either): 78 of
    # its 500 questions have no answer in the corpus, which the qrels leave out and the loader warns of
    dataset = load_dataset(data_dir / 'hotpotqa')
    with pytest.warns(UserWarning, match='427 supporting paragraph.* 78 of 500 questions keep no answer'):
        qrels = dataset.get_qrels()
    assert len(dataset.get_topics()) == 500 and dataset.corpus_size() == 4920
    assert (len(qrels), qrels['qid'].nunique()) == (573, 422)


def test_bars_over_a_corpus_of_known_size_show_their_total(tmp_path, capfd):
    """A BEIR corpus's size is known (its lines), so the corpus's own bar and an indexer's bar over it count to it."""
    from pyterrier_multiquery import flex_index, minilm
    from pyterrier_multiquery._files import DigestingIterable
    folder = tmp_path / 'beir'
    (folder / 'qrels').mkdir(parents=True)
    (folder / 'corpus.jsonl').write_text(''.join(f'{{"_id": "d{i}", "title": "", "text": "passage {i}"}}\n\n'
                                                 for i in range(5)))   # blank lines are no documents
    (folder / 'queries.jsonl').write_text('{"_id": "q1", "text": "passage"}\n')
    (folder / 'qrels' / 'test.tsv').write_text('query-id\tcorpus-id\tscore\nq1\td1\t1\n')
    dataset = load_dataset(folder)
    assert dataset.corpus_size() == 5 and len(dataset.get_corpus_iter(verbose=False)) == 5
    assert len(DigestingIterable(dataset.get_corpus_iter(verbose=False))) == 5
    assert len(list(dataset.get_corpus_iter(verbose=False))) == 5
    capfd.readouterr()
    list(dataset.get_corpus_iter(verbose=True))
    flex_index(tmp_path / 'minilm.flex', minilm(), lambda: dataset.get_corpus_iter(verbose=False))
    bars = capfd.readouterr().err.replace('\r', '\n')
    assert 'corpus: 100%' in bars and f'indexing {tmp_path / "minilm.flex"}: 100%' in bars and '5/5' in bars
