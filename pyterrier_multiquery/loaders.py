"""Loaders that turn local test-collection files into PyTerrier dataset objects.

Every loader returns a :class:`pyterrier.datasets.Dataset` with ``get_topics()`` (``qid``, ``query``),
``get_qrels()`` (``qid``, ``docno``, ``label``, and ``iteration`` holding the answer id for multi-answer
collections) and ``get_corpus_iter()`` (dicts with ``docno`` and ``text``). :func:`load_dataset` picks
the loader from what a path holds, or hands ``irds:`` identifiers to :func:`pyterrier.get_dataset`.
"""
import json
import re
import warnings
from pathlib import Path
from typing import Dict, Iterator, Optional, Sequence, Union

import pandas as pd
import pyterrier as pt

from pyterrier_multiquery._transformer import DerivedIdentity

PathLike = Union[str, Path]
TREC_CHUNK_SIZE = 1 << 20  # characters read at a time from a TREC document file


class LocalDataset(pt.datasets.Dataset):
    """Base class of the local loaders: topics and qrels per variant, corpus as a stream of dicts."""
    name = 'local'
    default_variant: Optional[str] = None
    files: Dict[str, Path] = {}  # the files a loader with file-name arguments reads, by role

    def __init__(self, path: PathLike):
        """
        Args:
            path: The file or directory that holds the collection.
        """
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f'dataset path {str(self.path)!r} does not exist')

    def _topics(self, variant: Optional[str]) -> pd.DataFrame:
        raise NotImplementedError()

    def _qrels(self, variant: Optional[str]) -> pd.DataFrame:
        raise NotImplementedError()

    def _corpus(self) -> Iterator[Dict[str, str]]:
        raise NotImplementedError()

    def corpus_size(self) -> Optional[int]:
        """Returns the number of documents when known cheaply (for progress bars), else None."""
        return None

    def get_topics(self, variant: Optional[str] = None) -> pd.DataFrame:
        """Returns the topics as a frame with ``qid`` and ``query``."""
        return self._topics(variant or self.default_variant)

    def get_qrels(self, variant: Optional[str] = None) -> pd.DataFrame:
        """Returns the qrels as a frame with ``qid``, ``docno``, ``label`` (and ``iteration``)."""
        return self._qrels(variant or self.default_variant)

    def get_corpus_iter(self, *, verbose: bool = True) -> Iterator[Dict[str, str]]:
        """Yields the documents as dicts with ``docno`` and ``text``; the iterator has a length where the corpus size
        is known, so that the bars of whatever reads it (an indexer's) show their total."""
        size = self.corpus_size()
        if verbose:
            return pt.tqdm(self._corpus(), desc=f'{self.name} corpus', unit='d', total=size)
        return self._corpus() if size is None else SizedIterator(self._corpus(), size)

    def text_loader(self, fields: Union[str, Sequence[str]] = '*', *, verbose: bool = False) -> pt.Transformer:
        """A transformer that adds the corpus fields of each row's ``docno``, so ``pt.text.get_text(dataset)`` works.

        The corpus is read into memory on first use.

        Args:
            fields: A field name, a list of them, or ``'*'`` for every field of the corpus but ``docno``.
            verbose: Whether to show progress while reading the corpus.
        """
        return CorpusTextLoader(self, fields, verbose=verbose)

    def get_corpus_lang(self) -> str:
        return 'en'

    def get_topics_lang(self) -> str:
        return 'en'

    def _key(self):
        """What identifies the collection: the loader and the files it reads (resolved: two spellings of one path,
        relative and absolute, or through a link, are one collection)."""
        return (type(self), *(str(Path(path).resolve()) for path in (self.path, *self.files.values())))

    def __eq__(self, other):
        return isinstance(other, LocalDataset) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return f'{type(self).__name__}({str(self.path)!r})'


class CorpusTextLoader(DerivedIdentity, pt.Transformer):
    """Adds documents' corpus fields (``text``, ...) to a frame with ``docno``: a local dataset's ``text_loader``."""

    def __init__(self, dataset: LocalDataset, fields: Union[str, Sequence[str]] = '*', *, verbose: bool = False):
        self.dataset = dataset
        self.fields = fields
        self.verbose = verbose
        self._corpus = None

    def corpus(self) -> pd.DataFrame:
        """The corpus as a frame indexed by ``docno`` (read once)."""
        if self._corpus is None:
            self._corpus = pd.DataFrame(self.dataset.get_corpus_iter(verbose=self.verbose)).set_index('docno')
        return self._corpus

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        """``inp`` with the fields of each ``docno`` joined on."""
        pt.validate.columns(inp, includes=['docno'])
        corpus = self.corpus()
        fields = list(corpus.columns) if self.fields == '*' else [self.fields] if isinstance(self.fields, str) \
            else list(self.fields)
        unknown = [f for f in fields if f not in corpus.columns]
        if unknown:
            raise ValueError(f'{self.dataset!r} has no corpus field(s) {unknown}; it has {list(corpus.columns)}')
        missing = ~inp['docno'].isin(corpus.index)
        if missing.any():
            raise KeyError(f'docno(s) not in {self.dataset!r}: {inp.loc[missing, "docno"].unique()[:5].tolist()}')
        return inp.drop(columns=[f for f in fields if f in inp.columns]).join(corpus[fields], on='docno')



class BeirDataset(LocalDataset):
    """A BEIR directory: ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/<split>.tsv``.

    Documents are yielded with ``title`` and with ``text`` = title and body joined by a space, the text that
    BEIR's evaluation encodes. The variant is the qrels split (default ``test``).
    """
    name = 'beir'
    default_variant = 'test'

    def __init__(self, path: PathLike):
        super().__init__(path)
        for required in ('corpus.jsonl', 'queries.jsonl', 'qrels'):
            if not (self.path / required).exists():
                raise FileNotFoundError(f'BEIR directory {str(self.path)!r} has no {required}')

    def _qrels(self, variant):
        file = self.path / 'qrels' / f'{variant}.tsv'
        if not file.exists():
            splits = sorted(p.stem for p in (self.path / 'qrels').glob('*.tsv'))
            raise ValueError(f'no qrels split {variant!r} in {str(self.path)!r}; available: {splits}')
        qrels = pd.read_csv(file, sep='\t', dtype=str)
        qrels.columns = ['qid', 'docno', 'label']
        return qrels.astype({'label': int})

    def _topics(self, variant):
        qids = set(self._qrels(variant)['qid'])
        rows = [{'qid': q['_id'], 'query': q['text']} for q in _iter_jsonl(self.path / 'queries.jsonl')]
        return pd.DataFrame([r for r in rows if r['qid'] in qids], columns=['qid', 'query'])

    def corpus_size(self) -> int:
        """The number of documents: the non-blank lines of ``corpus.jsonl`` (counted once, a pass over the file)."""
        if getattr(self, '_corpus_size', None) is None:
            with open(self.path / 'corpus.jsonl', 'rb') as f:
                self._corpus_size = sum(1 for line in f if line.strip())
        return self._corpus_size

    def _corpus(self):
        for doc in _iter_jsonl(self.path / 'corpus.jsonl'):
            title = doc.get('title') or ''
            yield {'docno': doc['_id'], 'title': title, 'text': f'{title} {doc["text"]}'.strip()}


class TrecDataset(LocalDataset):
    """TREC files in the Vaswani layout: ``corpus.trec`` (``<DOC><DOCNO>``), ``topics.trec`` and ``qrels``."""
    name = 'trec'
    _DOC = re.compile(r'<DOC>\s*<DOCNO>\s*(.*?)\s*</DOCNO>(.*?)</DOC>', re.DOTALL)

    def __init__(self, path: PathLike, corpus: str = 'corpus.trec', topics: str = 'topics.trec', qrels: str = 'qrels'):
        """
        Args:
            path: The directory that holds the files.
            corpus: The TREC document file, relative to ``path``.
            topics: The TREC topics file, relative to ``path``.
            qrels: The qrels file (``qid iteration docno label``), relative to ``path``.
        """
        super().__init__(path)
        self.files = {'corpus': self.path / corpus, 'topics': self.path / topics, 'qrels': self.path / qrels}
        for what, file in self.files.items():
            if not file.exists():
                raise FileNotFoundError(f'TREC {what} file {str(file)!r} does not exist')

    def _topics(self, variant):
        return pt.io.read_topics(str(self.files['topics']), format='trec')

    def _qrels(self, variant):
        """The qrels with their ``iteration`` column, which ``pt.io.read_qrels`` drops: diversity qrels keep their
        subtopics (answer ids) there, and ``0``, the usual placeholder, means none (:mod:`~.measures`)."""
        names = ['qid', 'iteration', 'docno', 'label']
        try:
            qrels = pd.read_csv(self.files['qrels'], sep=r'\s+', header=None, dtype=str, names=names)
        except pd.errors.EmptyDataError:
            qrels = pd.DataFrame(columns=names, dtype=str)
        if qrels.isna().any().any():
            row = int(qrels.isna().any(axis=1).idxmax())
            raise ValueError(f'{str(self.files["qrels"])!r} line {row + 1} has fewer than 4 fields '
                             '(qid iteration docno label)')
        return qrels.astype({'label': int})[['qid', 'docno', 'label', 'iteration']]

    def _corpus(self):
        with open(self.files['corpus'], encoding='utf-8') as f:
            buffer = ''
            for chunk in iter(lambda: f.read(TREC_CHUNK_SIZE), ''):
                buffer += chunk
                end = 0
                for match in self._DOC.finditer(buffer):
                    skipped = buffer[end:match.start()].strip()
                    if skipped:  # a <DOC> the pattern did not read: its <DOCNO> is not its first element
                        raise ValueError(f'{str(self.files["corpus"])!r} has a <DOC> element whose first element is '
                                         f'not <DOCNO> (or text outside <DOC>): {skipped[:80]!r}')
                    yield {'docno': match.group(1), 'text': ' '.join(match.group(2).split())}
                    end = match.end()
                buffer = buffer[end:]
        if buffer.strip():
            raise ValueError(f'{str(self.files["corpus"])!r} ends with an incomplete <DOC> element')


class RamDocsDataset(LocalDataset):
    """RAMDocs (one JSON question per line): all questions' passages pooled into one corpus.

    ``qid`` is the question's position among the file's questions (from 0) and ``docno`` is
    ``<qid>-<position of the passage>``, so both stay stable for the same file. A passage of type ``correct`` is
    relevant to its question for the answer it supports: ``iteration`` holds the answer's position (from 1) in
    ``gold_answers``. Gold answers that no passage supports do not appear in the qrels.
    """
    name = 'ramdocs'
    #: The fields of a question, and of each of its passages.
    FIELDS, PASSAGE_FIELDS = ('question', 'documents', 'gold_answers'), ('text', 'type')

    def __init__(self, path: PathLike):
        """
        Args:
            path: The ``.jsonl`` file, or a directory holding one.

        Raises:
            ValueError: If a line is not a question of the format (its fields, and its passages').
        """
        super().__init__(path)
        if self.path.is_dir():
            files = sorted(self.path.glob('*.jsonl'))
            if len(files) != 1:
                raise FileNotFoundError(f'expected one RAMDocs .jsonl file in {str(self.path)!r}, found {len(files)}')
            self.path = files[0]
        self.questions = list(_iter_jsonl(self.path))
        for number, question in enumerate(self.questions, start=1):
            passages = question.get('documents') if isinstance(question, dict) else None
            if not isinstance(question, dict) or any(f not in question for f in self.FIELDS) or \
                    not isinstance(passages, list) or \
                    not all(isinstance(p, dict) and all(f in p for f in self.PASSAGE_FIELDS) for p in passages):
                found = sorted(question)[:8] if isinstance(question, dict) else type(question).__name__
                raise ValueError(f'{str(self.path)!r}: question {number} is not a RAMDocs question (the fields '
                                 f'{list(self.FIELDS)}, each passage with {list(self.PASSAGE_FIELDS)}; found {found})')

    def _topics(self, variant):
        return pd.DataFrame([{'qid': str(i), 'query': q['question']} for i, q in enumerate(self.questions)])

    def _qrels(self, variant):
        rows = []
        for i, q in enumerate(self.questions):
            for j, doc in enumerate(q['documents']):
                if doc['type'] == 'correct':
                    if doc['answer'] not in q['gold_answers']:
                        raise ValueError(f'question {i}: passage {j} supports {doc["answer"]!r}, not a gold answer')
                    answer = q['gold_answers'].index(doc['answer']) + 1
                    rows.append({'qid': str(i), 'docno': f'{i}-{j}', 'label': 1, 'iteration': str(answer)})
        return pd.DataFrame(rows, columns=['qid', 'docno', 'label', 'iteration'])

    def _corpus(self):
        for i, q in enumerate(self.questions):
            for j, doc in enumerate(q['documents']):
                yield {'docno': f'{i}-{j}', 'text': doc['text']}

    def corpus_size(self):
        return sum(len(q['documents']) for q in self.questions)


class MusiqueDataset(LocalDataset):
    """MuSiQue questions (``musique_*.json``) with their paragraph corpus (``musique_*_corpus.json``).

    ``docno`` is the paragraph's position in the corpus file; each supporting paragraph of a question is its
    own target, with ``iteration`` numbering them from 1.
    """
    name = 'musique'

    def __init__(self, path: PathLike, split: str = 'train'):
        """
        Args:
            path: The directory that holds ``musique_<split>.json`` and ``musique_<split>_corpus.json``.
            split: The file prefix's split name.
        """
        super().__init__(path)
        self.files = {'questions': self.path / f'musique_{split}.json',
                      'corpus': self.path / f'musique_{split}_corpus.json'}
        for what, file in self.files.items():
            if not file.exists():
                raise FileNotFoundError(f'MuSiQue {what} file {str(file)!r} does not exist')
        self.questions = json.loads(self.files['questions'].read_text(encoding='utf-8'))
        self.paragraphs = json.loads(self.files['corpus'].read_text(encoding='utf-8'))

    def _topics(self, variant):
        return pd.DataFrame([{'qid': q['id'], 'query': q['question']} for q in self.questions])

    def _qrels(self, variant):
        docnos = {(p['title'], p['text']): str(i) for i, p in enumerate(self.paragraphs)}
        rows = []
        for q in self.questions:
            supporting = [p for p in q['paragraphs'] if p['is_supporting']]
            for target, p in enumerate(supporting, start=1):
                key = (p['title'], p['paragraph_text'])
                if key not in docnos:
                    raise ValueError(f'question {q["id"]}: supporting paragraph {p["title"]!r} is not in the corpus')
                rows.append({'qid': q['id'], 'docno': docnos[key], 'label': 1, 'iteration': str(target)})
        return pd.DataFrame(rows, columns=['qid', 'docno', 'label', 'iteration'])

    def _corpus(self):
        for i, p in enumerate(self.paragraphs):
            yield {'docno': str(i), 'title': p['title'], 'text': f'{p["title"]} {p["text"]}'}

    def corpus_size(self):
        return len(self.paragraphs)


class HotpotQADataset(LocalDataset):
    """HotpotQA (and 2WikiMultiHopQA) questions in their own format: a JSON list or one object a line, each with
    ``_id``, ``question``, ``supporting_facts`` (``[title, sentence index]`` pairs) and ``context`` (``[title,
    [sentences]]`` paragraphs); 2WikiMultiHopQA adds ``evidences``, which are not read.

    The corpus is every distinct paragraph of all questions' contexts (title, then its sentences joined), numbered by
    first appearance; each supporting paragraph of a question (the context paragraph of a title its supporting facts
    name; where the context lacks it, the corpus's one paragraph of that title) is its own answer, ``iteration``
    numbering them from 1 in the order of the supporting facts. A supporting title with no paragraph is left out of
    the qrels, as RAMDocs' gold answers that no passage supports are, and the qrels warn how many were.
    """
    name = 'hotpotqa'
    FIELDS = ('_id', 'question', 'supporting_facts', 'context')

    def __init__(self, path: PathLike):
        """
        Args:
            path: The ``.json`` or ``.jsonl`` file, or a directory holding one.

        Raises:
            ValueError: If a question lacks a field of the format, or the file holds no question (a supporting
                title with no paragraph is left out of the qrels with a warning, not an error).
        """
        super().__init__(path)
        if self.path.is_dir():
            files = sorted([*self.path.glob('*.jsonl'), *self.path.glob('*.json')])
            if len(files) != 1:
                raise FileNotFoundError(f'expected one HotpotQA .json or .jsonl file in {str(self.path)!r}, '
                                        f'found {len(files)}')
            self.path = files[0]
        self.questions = _hotpotqa_questions(self.path)
        if not self.questions:
            raise ValueError(f'{str(self.path)!r} holds no question')
        for number, question in enumerate(self.questions, start=1):
            missing = [f for f in self.FIELDS if f not in question]
            if missing:
                raise ValueError(f'{str(self.path)!r}: question {number} has no {missing} field(s): not a HotpotQA or '
                                 f'2WikiMultiHopQA file (it has {sorted(question)[:8]})')
        if 'evidences' in self.questions[0]:
            self.name = '2wikimultihopqa'
        self.paragraphs = {}  # (title, text) -> docno, in order of first appearance
        self.titles = {}  # title -> the docnos of its distinct paragraphs
        for question in self.questions:
            for title, sentences in question['context']:
                key = (title, ''.join(sentences).strip())
                if key not in self.paragraphs:
                    self.paragraphs[key] = str(len(self.paragraphs))
                    self.titles.setdefault(title, []).append(self.paragraphs[key])

    def _topics(self, variant):
        return pd.DataFrame([{'qid': str(q['_id']), 'query': q['question']} for q in self.questions])

    def _qrels(self, variant):
        rows, missing, answerless = [], 0, 0
        for q in self.questions:
            context = {title: self.paragraphs[(title, ''.join(sentences).strip())] for title, sentences in q['context']}
            titles = list(dict.fromkeys(title for title, _ in q['supporting_facts']))
            found = [(target, context.get(title) or self.titles[title][0]) for target, title in
                     enumerate(titles, start=1) if title in context or len(self.titles.get(title, [])) == 1]
            missing += len(titles) - len(found)
            answerless += not found
            rows += [{'qid': str(q['_id']), 'docno': docno, 'label': 1, 'iteration': str(target)}
                     for target, docno in found]
        if missing:
            warnings.warn(f'{str(self.path)!r}: {missing} supporting paragraph(s) are neither in their question\'s '
                          f'context nor, by title, in the corpus: left out of the qrels; {answerless} of '
                          f'{len(self.questions)} questions keep no answer', stacklevel=2)
        return pd.DataFrame(rows, columns=['qid', 'docno', 'label', 'iteration'])

    def _corpus(self):
        for (title, text), docno in self.paragraphs.items():
            yield {'docno': docno, 'title': title, 'text': f'{title} {text}'}

    def corpus_size(self):
        return len(self.paragraphs)


def _hotpotqa_questions(path: Path) -> list:
    """The questions of a HotpotQA-format file: a JSON list (as HotpotQA and 2WikiMultiHopQA publish them) or one
    object a line."""
    with open(path, encoding='utf-8') as f:
        start = f.read(1)
        while start.isspace():
            start = f.read(1)
    if start == '[':
        try:
            return json.loads(path.read_text(encoding='utf-8'))
        except json.JSONDecodeError as e:
            raise ValueError(f'{str(path)!r} is not valid JSON: {e}') from None
    return list(_iter_jsonl(path))


def _first_record(path: Path) -> dict:
    """The first JSON object of a ``.json`` list or ``.jsonl`` file (an empty dict where there is none)."""
    try:
        with open(path, encoding='utf-8') as f:
            head = f.readline()  # a .jsonl file's first record, whole
            if head.lstrip().startswith('['):  # a list: its first object, on however many lines
                head += f.read(1 << 20)
                decoded, _ = json.JSONDecoder().raw_decode(head.lstrip()[1:].lstrip())
            else:
                decoded = json.loads(head) if head.strip() else {}
    except ValueError:
        return {}
    return decoded if isinstance(decoded, dict) else {}


def _holds_hotpotqa(path: Path) -> bool:
    """Whether ``path`` (a file, or a directory with one .json/.jsonl file) holds HotpotQA-format questions."""
    files = [path] if path.is_file() else [*path.glob('*.jsonl'), *path.glob('*.json')]
    return len(files) == 1 and all(f in _first_record(files[0]) for f in ('supporting_facts', 'context'))


class CombinedDataset(LocalDataset):
    """Several collections as one, e.g. to train on RAMDocs and MuSiQue questions together.

    Each member's qids and docnos get its name as a prefix (``ramdocs/12``, ``musique/3``), so that no two members'
    identifiers collide; the corpus is the members' corpora one after another.
    """
    name = 'combined'

    def __init__(self, datasets: Union[Sequence[pt.datasets.Dataset], Dict[str, pt.datasets.Dataset]]):
        """
        Args:
            datasets: The members, by name (a sequence is named by each member's ``name``, numbered where two
                share one).
        """
        if not isinstance(datasets, dict):
            names = [getattr(d, 'name', 'dataset') for d in datasets]
            datasets = {(n if names.count(n) == 1 else f'{n}{i}'): d for i, (n, d) in enumerate(zip(names, datasets))}
        if len(datasets) < 2:
            raise ValueError(f'CombinedDataset needs at least two datasets, got {len(datasets)}')
        bad = [n for n in datasets if not n or '/' in n]
        if bad:
            raise ValueError(f'dataset names must be non-empty and hold no "/": {bad}')
        self.members = dict(datasets)

    @staticmethod
    def prefixed(frame: pd.DataFrame, name: str) -> pd.DataFrame:
        """``frame`` with ``name/`` before every ``qid`` and ``docno``."""
        frame = frame.copy()
        for column in ('qid', 'docno'):
            if column in frame.columns:
                frame[column] = f'{name}/' + frame[column].astype(str)
        return frame

    def _topics(self, variant):
        return pd.concat([self.prefixed(d.get_topics(variant), n) for n, d in self.members.items()], ignore_index=True)

    def _qrels(self, variant):
        return pd.concat([self.prefixed(d.get_qrels(variant), n) for n, d in self.members.items()], ignore_index=True)

    def _corpus(self):
        for name, dataset in self.members.items():
            for document in dataset.get_corpus_iter(verbose=False):
                yield {**document, 'docno': f'{name}/{document["docno"]}'}

    def corpus_size(self):
        sizes = [d.corpus_size() if hasattr(d, 'corpus_size') else None for d in self.members.values()]
        return None if None in sizes else sum(sizes)

    def _key(self):
        return (type(self), tuple((n, d) for n, d in self.members.items()))

    def __repr__(self):
        return f'{type(self).__name__}({self.members!r})'


def load_dataset(spec: PathLike) -> pt.datasets.Dataset:
    """Loads a dataset from a path or an ``irds:`` identifier.

    Args:
        spec: ``irds:<id>`` (through :func:`pyterrier.get_dataset`), or a path: a BEIR directory, a TREC
            directory (``corpus.trec``), a RAMDocs ``.jsonl`` file or directory, a MuSiQue directory, or a HotpotQA or
            2WikiMultiHopQA file (or a directory with one).

    Returns:
        The dataset.
    """
    spec = str(spec)
    if spec.startswith('irds:'):
        return pt.get_dataset(spec)
    path = Path(spec)
    if not path.exists():
        raise FileNotFoundError(f'dataset path {spec!r} does not exist (give a directory, a RAMDocs .jsonl file '
                                f'or an irds: identifier)')
    if _holds_hotpotqa(path):
        return HotpotQADataset(path)
    if path.is_file() or (path.is_dir() and any(path.glob('RAMDocs*.jsonl'))):
        return RamDocsDataset(path)
    if (path / 'corpus.jsonl').exists():
        return BeirDataset(path)
    if (path / 'corpus.trec').exists():
        return TrecDataset(path)
    corpus_files = sorted(path.glob('musique_*_corpus.json'))
    if corpus_files:
        return MusiqueDataset(path, split=corpus_files[0].name[len('musique_'):-len('_corpus.json')])
    raise ValueError(f'cannot tell what collection {spec!r} holds: expected corpus.jsonl (BEIR), corpus.trec '
                     f'(TREC), a RAMDocs .jsonl, musique_*.json files or a HotpotQA .json/.jsonl file')


class SizedIterator:
    """An iterator whose length is known in advance (``len()`` gives it), for progress bars."""

    def __init__(self, items: Iterator, size: int):
        self._items, self._size = items, size

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._items)

    def __len__(self) -> int:
        return self._size


def _iter_jsonl(path: Path) -> Iterator[dict]:
    with open(path, encoding='utf-8') as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f'{str(path)!r} line {number} is not valid JSON: {e}') from None
                yield record
