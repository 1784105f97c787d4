"""The text-generation interface shared by query generation, QAEncoder, CDP and query expansion."""
import hashlib
import json
import os
import sqlite3
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Dict, List, Sequence, Tuple, Union

Messages = List[Dict[str, str]]
Prompt = Union[str, Messages]


class GenerationError(RuntimeError):
    """Raised when a backend cannot produce text (unreachable server, refused request, malformed answer)."""


def as_messages(prompt: Prompt) -> Messages:
    """A chat prompt: a plain string is one user message."""
    if isinstance(prompt, str):
        return [{'role': 'user', 'content': prompt}]
    for message in prompt:
        if not isinstance(message, dict) or 'role' not in message or 'content' not in message:
            raise ValueError(f'a chat prompt is a list of {{"role", "content"}} dicts, got {message!r}')
    return list(prompt)


class TextGenerator(ABC):
    """Generates one completion per chat prompt. Subclasses set ``model_id`` and implement ``_generate``."""
    model_id: str

    def generate(self, prompts: Sequence[Prompt]) -> List[str]:
        """Generates the assistant's answer to each prompt (a string or a list of chat messages)."""
        if isinstance(prompts, str):   # else each character would be a prompt
            raise TypeError(f'generate takes a list of prompts, got the string {prompts[:40]!r}: pass [prompt]')
        prompts = list(prompts)   # a Series or another sequence as a list
        return self._generate([as_messages(p) for p in prompts]) if prompts else []

    @abstractmethod
    def _generate(self, prompts: List[Messages]) -> List[str]:
        """Generates for chat prompts."""

    def settings(self) -> Dict:
        """The settings that change what is generated (part of the cache key)."""
        return {}

    def cached(self, path: Union[str, Path]) -> 'CachedGenerator':
        """This generator behind a persistent cache at ``path`` (an SQLite file)."""
        return CachedGenerator(self, path)

    def _key(self) -> Tuple:
        """What decides the texts generated: the backend, the model and the settings."""
        return type(self), self.model_id, json.dumps(self.settings(), sort_keys=True)

    def __eq__(self, other):
        return isinstance(other, TextGenerator) and self._key() == other._key()

    def __repr__(self):
        settings = ''.join(f', {name}={value!r}' for name, value in self.settings().items())
        return f'{type(self).__name__}({self.model_id!r}{settings})'

    def __hash__(self):
        return hash(self._key())


class CachedGenerator(TextGenerator):
    """Answers prompts seen before from an SQLite cache keyed by (model, settings, prompt); generates the rest.

    The prompt holds the document it is about, so a rerun of the same pipeline generates nothing.
    """

    def __init__(self, generator: TextGenerator, path: Union[str, Path]):
        """
        Args:
            generator: The backend that generates cache misses.
            path: The SQLite cache file (created if missing).
        """
        self.generator = generator
        self.path = Path(path)
        self.model_id = generator.model_id
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with sqlite3.connect(self.path) as db:
            db.execute('CREATE TABLE IF NOT EXISTS generations (key TEXT PRIMARY KEY, text TEXT NOT NULL)')

    def settings(self) -> Dict:
        return self.generator.settings()

    def key(self, prompt: Messages) -> str:
        """The cache key of a prompt under this generator."""
        payload = json.dumps([self.model_id, self.settings(), prompt], sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(payload.encode()).hexdigest()

    def _generate(self, prompts: List[Messages]) -> List[str]:
        keys = [self.key(p) for p in prompts]
        found = {}
        with sqlite3.connect(self.path) as db:
            for start in range(0, len(keys), 500):  # SQLite bounds the number of parameters of one statement
                chunk = keys[start:start + 500]
                placeholders = ','.join('?' * len(chunk))
                found.update(db.execute(f'SELECT key, text FROM generations WHERE key IN ({placeholders})', chunk))
        missing = list(dict.fromkeys(k for k in keys if k not in found))
        if missing:
            prompt_of = dict(zip(keys, prompts))
            texts = self.generator.generate([prompt_of[k] for k in missing])
            with sqlite3.connect(self.path) as db:
                db.executemany('INSERT OR REPLACE INTO generations VALUES (?, ?)', zip(missing, texts))
            found.update(zip(missing, texts))
        return [found[k] for k in keys]

    def _key(self) -> Tuple:
        return CachedGenerator, self.generator._key(), os.fspath(self.path)

    def __repr__(self):
        return f'{self.generator!r}.cached({os.fspath(self.path)!r})'
