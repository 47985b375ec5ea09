"""Fixtures for the evaluation tests: local tokenizers, tiny masked LMs, brute-force scoring
references, and task data written in the real HF schemas of lm-eval's tasks.

Nothing here comes from a hub: tokenizers are trained on the Shakespeare sample corpus, models
are random (fixed seeds) or overfit in the test.
"""
from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest
import torch

_CACHE: dict = {}


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on the shared 2-core machine
    OpenMP spin-waiting made these tests ~10x slower. Import this into each test module;
    the previous setting is restored after every test."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

# ---------------------------------------------------------------------------- tokenizers

def corpus_texts(corpus_jsonl: Path, limit: int = 30) -> list[str]:
    with open(corpus_jsonl, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in itertools.islice(f, limit)]


def build_wordpiece_tokenizer(texts: list[str], out_dir: Path, vocab_size: int = 600):
    """A BERT WordPiece tokenizer ([CLS] [SEP] [MASK] [PAD] [UNK]) saved to `out_dir`."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import BertTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    backend = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    backend.train_from_iterator(texts, trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=specials, show_progress=False))
    tok = BertTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", sep_token="[SEP]",
                            pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]")
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))
    return tok


@pytest.fixture
def wordpiece_dir(corpus_jsonl, tmp_path_factory) -> Path:
    """Directory of a WordPiece tokenizer trained on the sample corpus (built once)."""
    if "wordpiece" not in _CACHE:
        out = tmp_path_factory.mktemp("wordpiece")
        build_wordpiece_tokenizer(corpus_texts(corpus_jsonl), out)
        _CACHE["wordpiece"] = out
    return _CACHE["wordpiece"]


@pytest.fixture
def bpe_dir(corpus_jsonl, tmp_path_factory) -> Path:
    """Our byte-level BPE (megatron_biglm.data.tokenizer) trained on the sample corpus."""
    if "bpe" not in _CACHE:
        from megatron_biglm.data.tokenizer import train_bpe_tokenizer

        out = tmp_path_factory.mktemp("bpe")
        train_bpe_tokenizer([str(corpus_jsonl)], 600, out)
        _CACHE["bpe"] = out
    return _CACHE["bpe"]


# ---------------------------------------------------------------------------- tiny models

def tiny_bert(vocab_size: int, seed: int = 0, hidden: int = 32, layers: int = 2,
              max_positions: int = 256):
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                     num_attention_heads=4, intermediate_size=2 * hidden,
                     max_position_embeddings=max_positions, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    return BertForMaskedLM(cfg).eval()


def tiny_biglm(vocab_size: int, special, seed: int = 0, hidden: int = 32, layers: int = 2,
               max_positions: int = 256):
    """A random BiGLM in its HF export layout (native EuroBERT: GQA, SwiGLU, RMSNorm, RoPE).
    `special` has bos_id / eos_id / pad_id / mask_id (a TokenIds or a tokenizer-like)."""
    from transformers import EuroBertConfig, EuroBertForMaskedLM

    ids = {role: getattr(special, f"{role}_id", None) if hasattr(special, f"{role}_id")
           else getattr(special, f"{role}_token_id") for role in ("bos", "eos", "pad", "mask")}
    torch.manual_seed(seed)
    cfg = EuroBertConfig(vocab_size=vocab_size, hidden_size=hidden,
                         intermediate_size=3 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=max_positions, tie_word_embeddings=True,
                         mlp_bias=False, attention_bias=False, hidden_act="silu",
                         pad_token_id=ids["pad"], bos_token_id=ids["bos"],
                         eos_token_id=ids["eos"], mask_token_id=ids["mask"])
    model = EuroBertForMaskedLM(cfg).eval()
    with torch.no_grad():  # EuroBERT's init is tiny; a wider spread makes rankings non-trivial
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
    return model


# ---------------------------------------------------------------------------- brute force

def bf_logprobs(model, seq: list[int], split: int) -> torch.Tensor:
    """log-softmax `[s, V]` of one unpadded sequence; the split mask is built with loops."""
    s = len(seq)
    dtype = next(model.parameters()).dtype
    mask = torch.full((1, 1, s, s), torch.finfo(dtype).min, dtype=dtype)
    for i in range(s):
        for j in range(s):
            if j < split or i >= split:
                mask[0, 0, i, j] = 0.0
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([seq]), attention_mask=mask).logits[0]
    return torch.log_softmax(logits.double(), dim=-1)


def _fill(cont, revealed, mask_id):
    return [tok if j in revealed else mask_id for j, tok in enumerate(cont)]


def bf_oneshot(model, prefix, cont, mask_id):
    lp = bf_logprobs(model, list(prefix) + [mask_id] * len(cont), len(prefix))
    total, greedy = 0.0, True
    for j, tok in enumerate(cont):
        total += lp[len(prefix) + j, tok].item()
        greedy &= int(lp[len(prefix) + j].argmax()) == tok
    return total, greedy


def bf_pll(model, prefix, cont, mask_id):
    total, greedy = 0.0, True
    for j, tok in enumerate(cont):
        seq = list(prefix) + _fill(cont, set(range(len(cont))) - {j}, mask_id)
        lp = bf_logprobs(model, seq, len(prefix))
        total += lp[len(prefix) + j, tok].item()
        greedy &= int(lp[len(prefix) + j].argmax()) == tok
    return total, greedy


def bf_l2r(model, prefix, cont, mask_id):
    total, greedy = 0.0, True
    for j, tok in enumerate(cont):
        seq = list(prefix) + _fill(cont, set(range(j)), mask_id)
        lp = bf_logprobs(model, seq, len(prefix))
        total += lp[len(prefix) + j, tok].item()
        greedy &= int(lp[len(prefix) + j].argmax()) == tok
    return total, greedy


def bf_gold_logprobs(model, prefix, cont, revealed, mask_id) -> dict[int, float]:
    """log p(gold) at every still-masked slot for one revealed set."""
    lp = bf_logprobs(model, list(prefix) + _fill(cont, revealed, mask_id), len(prefix))
    return {j: lp[len(prefix) + j, cont[j]].item() for j in range(len(cont)) if j not in revealed}


def bf_greedy_reveal(model, prefix, cont, mask_id):
    """Reveal, one slot per step, the gold token with the highest probability."""
    revealed, total = set(), 0.0
    for _ in cont:
        gold = bf_gold_logprobs(model, prefix, cont, revealed, mask_id)
        best = max(gold, key=lambda j: (gold[j], -j))
        total += gold[best]
        revealed.add(best)
    return total


def bf_best_order(model, prefix, cont, mask_id):
    """max over all n! reveal orders of the summed log p(gold) (explicit enumeration)."""
    memo: dict[frozenset, dict[int, float]] = {}
    best = float("-inf")
    for order in itertools.permutations(range(len(cont))):
        revealed, total = frozenset(), 0.0
        for j in order:
            if revealed not in memo:
                memo[revealed] = bf_gold_logprobs(model, prefix, cont, revealed, mask_id)
            total += memo[revealed][j]
            revealed = revealed | {j}
        best = max(best, total)
    return best


def bf_beam(model, prefix, cont, mask_id, beam):
    """The beam rule with explicit loops over candidates and slots."""
    candidates = [(frozenset(), 0.0)]
    for _ in cont:
        children = []
        for revealed, score in candidates:
            gold = bf_gold_logprobs(model, prefix, cont, revealed, mask_id)
            ranked = sorted(gold, key=lambda j: (-gold[j], j))[:beam]
            for j in ranked:
                child, child_score = revealed | {j}, score + gold[j]
                for k, (existing, existing_score) in enumerate(children):
                    if existing == child:
                        if child_score > existing_score:
                            children[k] = (child, child_score)
                        break
                else:
                    children.append((child, child_score))
        children.sort(key=lambda c: -c[1])
        candidates = children[:beam]
    return candidates[0][1]


def bf_confidence_greedy_decode(model, prefix, n, mask_id) -> list[int]:
    """Fill n masked slots one at a time: the slot whose argmax is most probable first."""
    filled: dict[int, int] = {}
    for _ in range(n):
        seq = list(prefix) + [filled.get(j, mask_id) for j in range(n)]
        lp = bf_logprobs(model, seq, len(prefix))
        best_j, best_v, best_lp = None, None, float("-inf")
        for j in range(n):
            if j in filled:
                continue
            value, token = lp[len(prefix) + j].max(dim=-1)
            if value.item() > best_lp:
                best_j, best_v, best_lp = j, int(token), value.item()
        filled[best_j] = best_v
    return [filled[j] for j in range(n)]


def bf_l2r_greedy_decode(model, prefix, n, mask_id) -> list[int]:
    out: list[int] = []
    for j in range(n):
        lp = bf_logprobs(model, list(prefix) + out + [mask_id] * (n - j), len(prefix))
        out.append(int(lp[len(prefix) + j].argmax()))
    return out


def bf_oneshot_decode(model, prefix, n, mask_id) -> list[int]:
    lp = bf_logprobs(model, list(prefix) + [mask_id] * n, len(prefix))
    return [int(lp[len(prefix) + j].argmax()) for j in range(n)]


# ---------------------------------------------------------------------------- task data

_QA = [  # (question, correct, three distractors); simple English, real schema fields below
    ("What do plants need to make food", "sunlight", "sand", "smoke", "salt"),
    ("Which organ pumps blood through the body", "the heart", "the lung", "the ear", "the skin"),
    ("What is frozen water called", "ice", "steam", "mud", "glass"),
    ("Which animal is known for its long neck", "the giraffe", "the mouse", "the crab", "the owl"),
]


def task_docs(task: str, n: int = 3, seed: int = 0) -> list[dict]:
    """`n` documents of `task` in its HF dataset schema (the fields lm-eval's config reads)."""
    rng = random.Random(f"{task}-{seed}")
    docs = []
    for i in range(n):
        q, good, *bad = _QA[i % len(_QA)]
        options = [good] + bad
        rng.shuffle(options)
        gold = options.index(good)
        letters = "ABCD"
        if task in ("arc_easy", "arc_challenge"):
            docs.append({"id": f"q{i}", "question": q + "?", "answerKey": letters[gold],
                         "choices": {"text": options, "label": list(letters)}})
        elif task == "piqa":
            docs.append({"goal": f"To see {good} clearly", "sol1": options[0], "sol2": good,
                         "label": 1})
        elif task == "sciq":
            docs.append({"question": q + "?", "distractor1": bad[0], "distractor2": bad[1],
                         "distractor3": bad[2], "correct_answer": good,
                         "support": f"Science class discussed {good} today."})
        elif task == "winogrande":
            docs.append({"sentence": f"The teacher praised the pupil because _ knew about {good}.",
                         "option1": "the teacher", "option2": "the pupil", "answer": "2"})
        elif task == "logiqa":
            docs.append({"label": "abcd"[gold], "context": f"Everyone in the class studied {good}.",
                         "question": q + "?", "options": options})
        elif task == "race":
            problems = [{"question": q + "?", "options": options, "answer": letters[gold]}]
            docs.append({"article": f"A short article about {good}.", "problems": repr(problems),
                         "example_id": f"r{i}"})
        elif task == "social_iqa":
            docs.append({"context": f"Sam read a book about {good}.", "question": "Why did Sam do this?",
                         "answerA": f"to learn about {good}", "answerB": bad[0], "answerC": bad[1],
                         "label": "1"})
        elif task == "boolq":
            docs.append({"question": f"is {good} the answer to {q.lower()}",
                         "passage": f"{q}? The answer is {good}.", "idx": i, "label": 1})
        elif task == "hellaswag":
            docs.append({"ind": i, "activity_label": "Science", "ctx_a": q + "?",
                         "ctx_b": "the answer is", "ctx": f"{q}? the answer is",
                         "endings": options, "source_id": f"h{i}", "split": "val",
                         "split_type": "indomain", "label": str(gold)})
        elif task == "truthfulqa_mc1":
            docs.append({"question": q + "?", "mc1_targets": {"choices": [good] + bad,
                                                              "labels": [1, 0, 0, 0]}})
        else:
            raise KeyError(task)
    return docs


def write_task_data(data_dir: Path, tasks, n: int = 3) -> Path:
    data_dir.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        with open(data_dir / f"{task}.jsonl", "w", encoding="utf-8") as f:
            for doc in task_docs(task, n):
                f.write(json.dumps(doc) + "\n")
    return data_dir


# ---------------------------------------------------------------------------- saved models

@pytest.fixture
def bert_dir(wordpiece_dir, tmp_path_factory) -> Path:
    """A tiny random BertForMaskedLM saved with the local WordPiece tokenizer."""
    if "bert_dir" not in _CACHE:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(wordpiece_dir))
        out = tmp_path_factory.mktemp("tiny_bert")
        tiny_bert(len(tok), seed=5).save_pretrained(str(out))
        tok.save_pretrained(str(out))
        _CACHE["bert_dir"] = out
    return _CACHE["bert_dir"]


@pytest.fixture
def biglm_dir(bpe_dir, tmp_path_factory) -> Path:
    """A tiny random BiGLM export (native EuroBERT layout) saved with our BPE tokenizer."""
    if "biglm_dir" not in _CACHE:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(bpe_dir))
        out = tmp_path_factory.mktemp("tiny_biglm")
        tiny_biglm(len(tok), tok, seed=5).save_pretrained(str(out))
        tok.save_pretrained(str(out))
        _CACHE["biglm_dir"] = out
    return _CACHE["biglm_dir"]


def instances(pairs, request_type: str = "loglikelihood"):
    """lm-eval Instances for (context, continuation) pairs (or (text,) for rolling)."""
    from lm_eval.api.instance import Instance

    return [Instance(request_type=request_type, doc={}, arguments=tuple(args), idx=i)
            for i, args in enumerate(pairs)]


# ---------------------------------------------------------------------------- overfit model

def corpus_sentences(corpus_jsonl: Path, count: int, min_words: int = 8, max_words: int = 12):
    """`count` distinct lines of real text (Shakespeare) with a given number of words."""
    seen, out = set(), []
    with open(corpus_jsonl, encoding="utf-8") as f:
        for line in f:
            for text in json.loads(line)["text"].splitlines():
                words = text.strip().split()
                if min_words <= len(words) <= max_words and text.strip() not in seen:
                    seen.add(text.strip())
                    out.append(" ".join(words))
                    if len(out) == count:
                        return out
    raise ValueError(f"only {len(out)} suitable sentences in {corpus_jsonl}")


def overfit_biglm_style(model, tokenizer, sentences, steps: int = 300, lr: float = 3e-3,
                        seed: int = 0):
    """Train `model` on `sentences` with BiGLM's objective: a random split, prefix rows see
    only the prefix (4D mask), suffix tokens masked with a ratio drawn from U(0.2, 1)."""
    from megatron_biglm.model.attention_masks import additive_mask, sequence_mask

    gen = torch.Generator().manual_seed(seed)
    rows = [[tokenizer.cls_token_id] + tokenizer(s, add_special_tokens=False)["input_ids"]
            for s in sentences]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    for r, row in enumerate(rows):
        ids[r, :len(row)] = torch.tensor(row)
    lengths = torch.tensor([len(r) for r in rows])
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        split = torch.stack([torch.randint(1, int(n) - 1, (1,), generator=gen)[0] for n in lengths])
        pos = torch.arange(width)[None]
        suffix = (pos >= split[:, None]) & (pos < lengths[:, None])
        ratio = 0.2 + 0.8 * torch.rand(len(rows), 1, generator=gen)
        masked = suffix & (torch.rand(ids.shape, generator=gen) < ratio)
        masked[torch.arange(len(rows)), split] = True  # at least one target per row
        inputs = torch.where(masked, tokenizer.mask_token_id, ids)
        labels = torch.where(masked, ids, -100)
        mask = additive_mask(sequence_mask(lengths, width, split), torch.float32)
        loss = model(input_ids=inputs, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), float(loss.detach())
