"""Generation through an OpenAI-compatible chat-completions server (vLLM, llama.cpp server, hosted APIs)."""
import os
import time
from typing import Dict, List, Optional

import pyterrier as pt

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery.generation.base import GenerationError, Messages, TextGenerator

RETRIED_STATUSES = (408, 409, 429, 500, 502, 503, 504)


class OpenAICompatibleGenerator(TextGenerator):
    """POSTs each prompt to ``{base_url}/chat/completions``, retrying with exponential backoff.

    Connection errors, timeouts and the statuses in ``RETRIED_STATUSES`` are retried (``Retry-After`` is honoured);
    any other error status, or an answer without ``choices[0].message.content``, raises :class:`GenerationError`
    naming the URL and the status.
    """

    def __init__(self, model: str, *, base_url: Optional[str] = None, api_key_env: str = 'OPENAI_API_KEY',
                 max_tokens: int = 256, temperature: float = 0.0, timeout: float = 60.0, max_retries: int = 4,
                 backoff: float = 1.0, verbose: bool = False):
        """
        Args:
            model: The model name the server expects.
            base_url: The API root, e.g. ``http://127.0.0.1:8000/v1`` (default: ``$OPENAI_BASE_URL``).
            api_key_env: Environment variable holding the API key (sent as a bearer token when set).
            max_tokens: Most tokens generated per prompt.
            temperature: Sampling temperature (0: greedy).
            timeout: Seconds to wait for one answer.
            max_retries: Retries after the first attempt.
            backoff: First wait between attempts in seconds; doubled each retry.
            verbose: Whether to show a progress bar over prompts.
        """
        base_url = base_url or os.environ.get('OPENAI_BASE_URL')
        if not base_url:
            raise ValueError('give base_url or set OPENAI_BASE_URL (e.g. http://127.0.0.1:8000/v1)')
        if max_retries < 0:
            raise ValueError(f'max_retries must be at least 0, got {max_retries}')
        self.model = model
        self.base_url = base_url.rstrip('/')
        self.model_id = f'{self.base_url}::{model}'
        self.api_key_env = api_key_env
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.verbose = verbose

    def settings(self) -> Dict:
        return {'max_tokens': self.max_tokens, 'temperature': self.temperature}

    def _generate(self, prompts: List[Messages]) -> List[str]:
        with requires('generation'):
            import requests
        with requests.Session() as session:
            key = os.environ.get(self.api_key_env)
            if key:
                session.headers['Authorization'] = f'Bearer {key}'
            prompts = pt.tqdm(prompts, desc=repr(self), unit='prompt') if self.verbose else prompts
            return [self._complete(session, p) for p in prompts]

    def _complete(self, session, prompt: Messages) -> str:
        with requires('generation'):
            import requests
        url = f'{self.base_url}/chat/completions'
        body = {'model': self.model, 'messages': prompt, 'max_tokens': self.max_tokens, 'temperature': self.temperature}
        for attempt in range(self.max_retries + 1):
            last_try = attempt == self.max_retries
            try:
                response = session.post(url, json=body, timeout=self.timeout)
            except (requests.ConnectionError, requests.Timeout) as e:
                if last_try:
                    raise GenerationError(f'{url}: no answer after {attempt + 1} attempts '
                                          f'({type(e).__name__}: {e})') from e
                time.sleep(self.backoff * 2 ** attempt)
                continue
            if response.status_code in RETRIED_STATUSES and not last_try:
                time.sleep(_retry_after(response) or self.backoff * 2 ** attempt)
                continue
            if response.status_code != 200:
                raise GenerationError(f'{url} answered {response.status_code} after {attempt + 1} attempt(s): '
                                      f'{response.text[:300]}')
            try:
                content = response.json()['choices'][0]['message']['content']
            except (ValueError, KeyError, IndexError, TypeError):
                content = None
            if not isinstance(content, str):  # reasoning models' servers may send "content": null
                raise GenerationError(f'{url} answered 200 without a text in choices[0].message.content: '
                                      f'{response.text[:300]}')
            return content

    def __repr__(self):
        return f'OpenAICompatibleGenerator({self.model!r}, base_url={self.base_url!r})'


def _retry_after(response) -> Optional[float]:
    try:
        return float(response.headers.get('Retry-After'))
    except (TypeError, ValueError):
        return None
