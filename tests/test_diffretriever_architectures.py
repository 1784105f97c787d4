"""DiffRetriever on the architectures it was made for, next to BERT: a ModernBERT masked LM and a DiffusionGemma
block-diffusion LM (prompt encoder + bidirectional canvas decoder), each a tiny random checkpoint saved with a small
tokenizer of its family's kind (byte-level BPE with [CLS]/[SEP]; Gemma's tokenizer with a chat template)."""
import json

import numpy as np
import pandas as pd
import pyterrier  # noqa: F401  (before pyterrier_alpha, which cannot be imported first)
import pytest

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')
pytest.importorskip('peft')

from pyterrier_multiquery.diffretriever import DiffRetriever  # noqa: E402
from pyterrier_multiquery.diffretriever.encoder import MaskedBackbone  # noqa: E402
from pyterrier_multiquery.diffretriever.lora import add_lora, merge_lora  # noqa: E402
from pyterrier_multiquery.diffretriever.sparse import content_token_ids  # noqa: E402
from pyterrier_multiquery.diffretriever.training import contrastive_loss  # noqa: E402

CORPUS = ['Query: "cats and dogs". Use a few words to represent the query in a retrieval task. '
          'Make sure your words are in lowercase.',
          'Passage: "heart disease of the protein". Use one word to represent the passage in a retrieval task. '
          'Make sure your word is in lowercase.',
          'The words are: "cats" The word is: "dogs" user model heart disease protein retrieval of words\n',
          'cats', 'dogs', 'heart', 'protein', 'the'] * 3
GEMMA_CHAT = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' "
              "else m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
              "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
TRIPLES = [('cats', 'cats and dogs', 'heart disease'), ('heart disease', 'the heart', 'protein'),
           ('protein', 'protein of cats', 'dogs')]


def _bpe(specials, pre_tokenizer, vocab_size):
    from tokenizers import Tokenizer, models, trainers
    bpe = Tokenizer(models.BPE(unk_token=specials[1] if specials[0] == '[PAD]' else '<unk>'))
    bpe.pre_tokenizer = pre_tokenizer
    bpe.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                        show_progress=False))
    return bpe


@pytest.fixture(scope='module')
def modernbert(tmp_path_factory):
    """A 2-layer ModernBertForMaskedLM and a byte-level BPE tokenizer with ``[CLS] $A [SEP]`` and ``[MASK]``."""
    from tokenizers import decoders, pre_tokenizers, processors
    path = tmp_path_factory.mktemp('modernbert')
    bpe = _bpe(['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'], pre_tokenizers.ByteLevel(add_prefix_space=False), 400)
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.TemplateProcessing(single='[CLS] $A [SEP]', special_tokens=[('[CLS]', 2),
                                                                                                ('[SEP]', 3)])
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token='[PAD]', unk_token='[UNK]',
                                               cls_token='[CLS]', sep_token='[SEP]', mask_token='[MASK]')
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                           num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=256,
                                           pad_token_id=0, cls_token_id=2, sep_token_id=3, bos_token_id=2,
                                           eos_token_id=3)
    transformers.ModernBertForMaskedLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope='module')
def diffusion_gemma(tmp_path_factory):
    """A 2-layer DiffusionGemmaForBlockDiffusion (2 experts, a 1-layer vision tower it never uses) and a Gemma
    tokenizer (``<mask>`` is id 4) with a Gemma chat template."""
    from tokenizers import pre_tokenizers
    path = tmp_path_factory.mktemp('diffusion_gemma')
    specials = ['<pad>', '<eos>', '<bos>', '<unk>', '<mask>', '<start_of_turn>', '<end_of_turn>']
    state = json.loads(_bpe(specials, pre_tokenizers.Metaspace(prepend_scheme='never'), 400).to_str())['model']
    tok = transformers.GemmaTokenizer(vocab=state['vocab'], merges=[tuple(m) for m in state['merges']],
                                      additional_special_tokens=specials[5:])
    tok.chat_template = GEMMA_CHAT
    torch.manual_seed(0)
    config = transformers.DiffusionGemmaConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, global_head_dim=8,
                         max_position_embeddings=256, sliding_window=256, num_experts=2, top_k_experts=1,
                         moe_intermediate_size=16, layer_types=['sliding_attention', 'full_attention']),
        vision_config=dict(model_type='gemma4_vision', hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=8))
    transformers.DiffusionGemmaForBlockDiffusion(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


ARCHS = {'modernbert': ('ModernBertForMaskedLM', False), 'diffusion_gemma': ('DiffusionGemmaForBlockDiffusion', True)}


@pytest.fixture(params=list(ARCHS))
def arch(request):
    return request.param, request.getfixturevalue(request.param)


def load(path, **kwargs):
    return DiffRetriever.from_pretrained(str(path), k_query=2, k_doc=3, device='cpu', **kwargs)


def manual(enc, text, k, side):
    """Hidden states and logits at the mask positions of one unpadded row, by calling the model by hand: the whole
    row for a masked LM; the prompt before the first mask and the canvas from it on for DiffusionGemma."""
    input_ids, _, positions, _, _ = enc.batch([text], k, side)
    ids, pos = input_ids[0], positions[0]
    with torch.no_grad():
        if enc.backbone.canvas:
            start = int(pos[0])
            out = enc.backbone.model(input_ids=ids[None, :start], decoder_input_ids=ids[None, start:],
                                     output_hidden_states=True)
            pos = pos - start
        else:
            out = enc.backbone.model(input_ids=ids[None], output_hidden_states=True)
    return out.hidden_states[-1][0, pos], out.logits[0, pos]


def test_loads_with_its_vocabulary_head_and_mask_token(arch):
    name, path = arch
    enc = load(path)
    cls, canvas = ARCHS[name]
    tok = enc.backbone.tokenizer
    assert type(enc.backbone.model).__name__ == cls and enc.backbone.head == 'lm' and enc.backbone.canvas is canvas
    assert enc.backbone.mask_token_id == tok.mask_token_id == tok.convert_tokens_to_ids(tok.mask_token)
    assert repr(enc) == f"DiffRetriever({cls}, k_query=2, k_doc=3, steps=1, max_length=256, vectors='masks')"


def test_layouts(modernbert, diffusion_gemma):
    bert = load(modernbert)
    tok = bert.backbone.tokenizer
    ids, _, pos, _, _ = bert.batch(['cats'], 2, 'query')
    ids, pos = ids[0].tolist(), pos[0].tolist()
    assert ids[0] == tok.cls_token_id and [ids[p] for p in pos] == [tok.mask_token_id] * 2
    assert ids[pos[-1] + 1:] == tok('"', add_special_tokens=False)['input_ids'] + [tok.sep_token_id]
    gemma = load(diffusion_gemma)
    tok = gemma.backbone.tokenizer
    ids, _, pos, _, _ = gemma.batch(['cats'], 1, 'doc')
    ids, (pos,) = ids[0].tolist(), pos[0].tolist()
    assert ids[:2] == [tok.bos_token_id, tok.convert_tokens_to_ids('<start_of_turn>')] and ids[pos] == 4
    # the canvas closes as the chat template closes an assistant turn: quote, <end_of_turn>, <eos>
    assert ids[pos + 1:] == tok('"', add_special_tokens=False)['input_ids'] + [
        tok.convert_tokens_to_ids('<end_of_turn>'), tok.eos_token_id]


def test_content_words_of_word_start_marking_tokenizers(arch):
    tok = load(arch[1]).backbone.tokenizer
    ids = tok('cats and the heart of dogs', add_special_tokens=False)['input_ids']
    # the text's first token starts a word though it carries no Ġ/▁ mark
    assert [tok.convert_ids_to_tokens(i).lstrip('Ġ▁') for i in content_token_ids(tok, ids)] == ['cats', 'heart',
                                                                                                  'dogs']


def test_one_forward_pass_gives_k_vectors_and_sparse_weights(arch):
    name, path = arch
    enc = load(path)
    calls = []
    enc.backbone.model.register_forward_hook(lambda *args: calls.append(1))
    topics = pd.DataFrame({'qid': ['1', '2'], 'query': ['cats and dogs', 'heart disease of the protein']})
    queries = enc.query_encoder()(topics)
    assert len(calls) == 1  # both queries, every mask position: one pass
    docs = enc.doc_encoder()(pd.DataFrame({'docno': ['a'], 'text': ['protein of cats']}))
    assert list(queries.columns) == ['qid', 'query', 'query_embs', 'query_toks']
    assert list(docs.columns) == ['docno', 'text', 'doc_embs', 'toks']
    assert [e.shape for e in queries['query_embs']] == [(2, 16)] * 2 and docs['doc_embs'][0].shape == (3, 16)
    np.testing.assert_allclose(np.linalg.norm(docs['doc_embs'][0], axis=1), 1., rtol=1e-5)
    # the representations are the model's own at the mask positions, row by row, and the sparse weights are
    # max_k log(1 + ReLU(logit)) over the content words of the text
    for (text, embs, toks) in zip(topics['query'], queries['query_embs'], queries['query_toks']):
        hidden, logits = manual(enc, text, 2, 'query')
        np.testing.assert_allclose(embs, torch.nn.functional.normalize(hidden, dim=-1).numpy(), atol=1e-5)
        tok = enc.backbone.tokenizer
        words = {}
        for tid in tok(text, add_special_tokens=False)['input_ids']:
            word = tok.convert_ids_to_tokens(tid).lstrip('Ġ▁')
            if word in ('cats', 'dogs', 'heart', 'disease', 'protein'):
                words[word] = float(torch.log1p(torch.relu(logits[:, tid])).max())
        assert toks == pytest.approx({w: v for w, v in words.items() if v > 0}, abs=1e-5)
        assert words  # every test word is a whole token of these tokenizers


def test_padding_does_not_change_the_representations(arch):
    """Rows of other lengths in a batch (pads in the prompt and the canvas), with iterative unmasking on top."""
    enc = load(arch[1])
    docs = pd.DataFrame({'docno': ['a', 'b', 'c'],
                         'text': ['cats', 'heart disease of the protein and dogs', 'the user']})
    one = DiffRetriever(enc.backbone, k_doc=3, steps=2, batch_size=1, device='cpu').doc_encoder()(docs)
    three = DiffRetriever(enc.backbone, k_doc=3, steps=2, batch_size=3, device='cpu').doc_encoder()(docs)
    for x, y in zip(one['doc_embs'], three['doc_embs']):
        np.testing.assert_allclose(x, y, atol=1e-5)
    for x, y in zip(one['toks'], three['toks']):
        assert x == pytest.approx(y, abs=1e-5)


def test_bidirectional_a_later_token_changes_the_mask_states(arch):
    enc = load(arch[1])
    input_ids, attention, positions, _, _ = enc.batch(['cats and dogs'], 2, 'query')
    after = int(positions[0, -1]) + 1  # the closing quote, after the last mask position
    changed = input_ids.clone()
    changed[0, after] = enc.backbone.tokenizer.convert_tokens_to_ids('protein' if arch[0] == 'modernbert'
                                                                     else '▁protein')
    with torch.no_grad():
        hidden, _ = enc.backbone.read(input_ids, attention, positions)
        again, _ = enc.backbone.read(input_ids, attention, positions)
        other, _ = enc.backbone.read(changed, attention, positions)
    torch.testing.assert_close(hidden, again)
    assert float((hidden - other).abs().amax(-1).min()) > 1e-4  # every mask position sees the later token


def test_lora_training_changes_the_output_and_the_saved_model_reproduces_it(arch, tmp_path, fine_tune):
    enc = load(arch[1])
    frame = pd.DataFrame({'docno': ['a'], 'text': ['cats and heart disease']})
    before = enc.doc_encoder()(frame)
    torch.manual_seed(0)
    with torch.no_grad():
        loss_before = float(contrastive_loss(enc, TRIPLES))
    fine_tune(enc, TRIPLES, lora=True, batch_size=3, learning_rate=3e-3)
    with torch.no_grad():
        assert float(contrastive_loss(enc, TRIPLES)) < loss_before
    trained = enc.doc_encoder()(frame)
    assert np.abs(trained['doc_embs'][0] - before['doc_embs'][0]).max() > 1e-4
    enc.save_pretrained(tmp_path / 'model')
    loaded = DiffRetriever.from_pretrained(str(tmp_path / 'model'), device='cpu')
    assert (loaded.k_query, loaded.k_doc, type(loaded.backbone.model)) == (2, 3, type(enc.backbone.model))
    after = loaded.doc_encoder()(frame)
    np.testing.assert_allclose(after['doc_embs'][0], trained['doc_embs'][0], atol=1e-5)
    assert after['toks'][0] == pytest.approx(trained['toks'][0], abs=1e-5)


def test_lora_on_weights_the_prompt_encoder_and_canvas_decoder_share(diffusion_gemma):
    backbone = MaskedBackbone.load(str(diffusion_gemma))
    model = backbone.model
    encoder, decoder = model.model.encoder.language_model.layers[0], model.model.decoder.layers[0]
    assert encoder.self_attn.q_proj is not decoder.self_attn.q_proj  # two modules, one weight
    add_lora(backbone)
    assert encoder.self_attn.q_proj is decoder.self_attn.q_proj  # so one adapter, trained for both
    assert hasattr(decoder.self_attn.q_proj, 'lora_A') and hasattr(decoder.mlp.down_proj, 'lora_A')
    assert not hasattr(model.lm_head, 'lora_A')  # the vocabulary head (tied to the embeddings) keeps its weights
    with torch.no_grad():
        decoder.self_attn.q_proj.lora_B['default'].weight.fill_(0.5)
        expected = decoder.self_attn.q_proj.get_delta_weight('default') + decoder.self_attn.q_proj.weight
    merged = merge_lora(backbone.model)
    assert not any(hasattr(m, 'lora_A') for m in merged.modules())
    assert decoder.self_attn.q_proj is encoder.self_attn.q_proj and type(decoder.self_attn.q_proj) is torch.nn.Linear
    torch.testing.assert_close(decoder.self_attn.q_proj.weight, expected)  # the delta merged once


def test_mask_token_from_the_config_or_given(modernbert, tmp_path):
    enc = load(modernbert)
    model, tok = enc.backbone.model, enc.backbone.tokenizer
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer, pad_token='[PAD]')
    assert tok.mask_token_id is None
    with pytest.raises(ValueError, match='pass mask_token_id'):
        MaskedBackbone(model, tok, 'lm')
    model.config.mask_token_id = 4
    assert MaskedBackbone(model, tok, 'lm').mask_token_id == 4
    assert MaskedBackbone(model, tok, 'lm', mask_token_id=7).mask_token_id == 7
    enc = DiffRetriever(MaskedBackbone(model, tok, 'lm', mask_token_id=7), device='cpu')
    enc.save_pretrained(tmp_path / 'model')
    assert DiffRetriever.from_pretrained(str(tmp_path / 'model'), device='cpu').backbone.mask_token_id == 7


def test_prompt_canvas_backbone_has_no_single_sequence_forward(diffusion_gemma):
    backbone = load(diffusion_gemma).backbone
    ids = torch.tensor([[2, 5, 6]])
    with pytest.raises(ValueError, match='reads a prompt and a canvas'):
        backbone.forward(ids, torch.ones_like(ids))
