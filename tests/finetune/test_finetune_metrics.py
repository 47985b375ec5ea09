"""Fine-tuning metrics against values worked out by hand (in the comments), cross-checked
against the reference libraries where they exist."""
import math

import pytest

from megatron_biglm.finetune.metrics import (accuracy, bleu, exact_match_score, f1_score, macro_f1,
                                             meteor, normalize_answer, rouge, squad_scores)
from megatron_biglm.finetune.metrics.wordnet import WordNetUnavailable, wordnet_reader


# ---- SQuAD --------------------------------------------------------------------------------
def test_squad_normalisation_follows_the_official_order():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("An apple a day") == "apple day"
    assert normalize_answer("theatre") == "theatre"          # articles only as whole words


def test_squad_em_f1_by_hand():
    # q1: "The Eiffel Tower!" vs "eiffel tower": equal after normalisation -> EM 1, F1 1.
    # q2: "in Paris, France" -> [in, paris, france]; gold "Paris" -> 1 shared, P=1/3, R=1,
    #     F1 = 2*(1/3)/(4/3) = 0.5; gold "France's capital" -> [frances, capital]: 0 shared.
    #     max -> EM 0, F1 0.5.
    # q3: "the the cat" -> [cat]; gold "cat cat" -> 1 shared, P=1, R=1/2 -> F1 2/3, EM 0.
    # q4: no prediction -> 0, 0.
    assert f1_score("in Paris, France", "Paris") == pytest.approx(0.5)
    assert f1_score("the the cat", "cat cat") == pytest.approx(2 / 3)
    assert exact_match_score("The Eiffel Tower!", "eiffel tower") == 1.0
    refs = {"q1": ["eiffel tower"], "q2": ["Paris", "France's capital"], "q3": ["cat cat"],
            "q4": ["x"]}
    preds = {"q1": "The Eiffel Tower!", "q2": "in Paris, France", "q3": "the the cat"}
    scores = squad_scores(preds, refs)
    assert scores["exact_match"] == pytest.approx(1 / 4)
    assert scores["f1"] == pytest.approx((1 + 0.5 + 2 / 3) / 4)
    assert scores["missing"] == 1


# ---- classification -----------------------------------------------------------------------
def test_accuracy_and_macro_f1_by_hand():
    preds = [0, 0, 1, 2, 2, 1]
    gold = [0, 1, 1, 2, 0, 1]
    # class 0: TP 1 (i0), FP 1 (i1), FN 1 (i4) -> 2/(2+1+1) = 1/2
    # class 1: TP 2 (i2, i5), FP 0, FN 1 (i1)  -> 4/5
    # class 2: TP 1 (i3), FP 1 (i4), FN 0      -> 2/3
    expected = (1 / 2 + 4 / 5 + 2 / 3) / 3
    assert accuracy(preds, gold) == pytest.approx(4 / 6)
    assert macro_f1(preds, gold) == pytest.approx(expected)
    # a class named but never seen counts as 0 (scikit-learn's zero_division=0)
    assert macro_f1(preds, gold, classes=[0, 1, 2, 3]) == pytest.approx(expected * 3 / 4)
    sklearn = pytest.importorskip("sklearn.metrics")
    assert sklearn.f1_score(gold, preds, average="macro") == pytest.approx(expected)


# ---- ROUGE --------------------------------------------------------------------------------
def test_rouge_by_hand_with_stemming():
    # rouge-score lowercases, keeps [a-z0-9] tokens and Porter-stems tokens longer than 3
    # characters: "cats" -> "cat". pred [the cat sat on a mat], ref [the cat sat on the mat]
    # R1: 5 shared of 6/6 -> 5/6. R2: pred bigrams {the cat, cat sat, sat on, on a, a mat},
    # ref {.., on the, the mat}: 3 shared of 5/5 -> 3/5. RL: LCS "the cat sat on mat" = 5 -> 5/6.
    scores = rouge(["the cats sat on a mat"], ["The cat sat on the mat."])
    assert scores["rouge1"] == pytest.approx(5 / 6)
    assert scores["rouge2"] == pytest.approx(3 / 5)
    assert scores["rougeL"] == pytest.approx(5 / 6)
    # without stemming "cats" != "cat": R1 = 4/6
    assert rouge(["the cats sat on a mat"], ["the cat sat on the mat"],
                 use_stemmer=False)["rouge1"] == pytest.approx(4 / 6)
    # mean over examples; with two references the best one counts
    two = rouge(["the cats sat on a mat", "a b"], [["zzz", "the cat sat on the mat"], "a b"])
    assert two["rouge1"] == pytest.approx((5 / 6 + 1) / 2)


# ---- BLEU ---------------------------------------------------------------------------------
def test_bleu_by_hand():
    hyp, ref = "the cat sat on a mat", "the cat sat on the mat"
    # clipped n-gram precisions: p1 5/6, p2 3/5, p3 2/4, p4 1/3; equal lengths -> BP 1
    assert bleu([hyp], [ref]) == pytest.approx((5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25)
    assert bleu([hyp], [ref], max_order=2) == pytest.approx(math.sqrt(5 / 6 * 3 / 5))
    # brevity penalty: all n-grams match, hyp 6 tokens vs ref 7 -> exp(1 - 7/6)
    assert bleu(["the cat sat on the mat"], ["the cat sat on the mat today"]) == pytest.approx(
        math.exp(1 - 7 / 6))
    # corpus BLEU pools counts over sentences (not a mean of sentence scores):
    # p1 (5+2)/(6+2), p2 (3+1)/(5+1), p3 2/4, p4 1/3, lengths 8 = 8
    corpus = bleu([hyp, "hello world"], [ref, "hello world"])
    assert corpus == pytest.approx((7 / 8 * 4 / 6 * 2 / 4 * 1 / 3) ** 0.25)
    import sacrebleu
    assert corpus == pytest.approx(sacrebleu.corpus_bleu([hyp, "hello world"],
                                                         [[ref, "hello world"]]).score / 100)


# ---- METEOR -------------------------------------------------------------------------------
class _NoSynonyms:
    """A WordNet stand-in with no synsets: METEOR then matches exact words and stems only."""

    def synsets(self, *args, **kwargs):
        return []


def test_meteor_by_hand_without_synonyms():
    # hyp [the cat sat on the rug] vs ref [the cat sat on the carpet]: 5 exact matches,
    # P = R = 5/6, Fmean = PR/(0.9P + 0.1R) = 5/6; one chunk -> frag 1/5,
    # penalty 0.5 * (1/5)^3 = 0.004 -> 5/6 * 0.996
    score = meteor(["the cat sat on the rug"], ["the cat sat on the carpet"], wordnet=_NoSynonyms())
    assert score == pytest.approx(5 / 6 * (1 - 0.5 * (1 / 5) ** 3))


def test_meteor_uses_wordnet_synonyms():
    try:
        wn = wordnet_reader()
    except WordNetUnavailable as exc:
        pytest.skip(str(exc))
    # rug.n.01 has the lemma "carpet": 6 matches, P = R = 1, one chunk -> frag 1/6,
    # penalty 0.5 * (1/6)^3 -> 1 - 1/432
    score = meteor(["the cat sat on the rug"], ["the cat sat on the carpet"], wordnet=wn)
    assert score == pytest.approx(1 - 0.5 * (1 / 6) ** 3)
    # mean over examples
    both = meteor(["the cat sat on the rug", "the cat sat on the rug"],
                  ["the cat sat on the carpet", "the cat sat on the carpet"], wordnet=wn)
    assert both == pytest.approx(score)


def test_meteor_without_wordnet_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("BIGLM_WORDNET_DIR", str(tmp_path))
    with pytest.raises(WordNetUnavailable, match="apt-get install .*wordnet-base wordnet-sense-index"):
        meteor(["a"], ["a"])


def test_wordnet_layout_built_from_debian_files(tmp_path, monkeypatch):
    from pathlib import Path

    from megatron_biglm.finetune.metrics.wordnet import DEBIAN_WORDNET, build_wordnet_dir

    with pytest.raises(WordNetUnavailable, match="wordnet-sense-index"):
        build_wordnet_dir(tmp_path / "x", source=tmp_path)   # no WordNet files there
    if not (Path(DEBIAN_WORDNET) / "index.sense").is_file():
        pytest.skip("Debian WordNet is not installed (apt-get install wordnet-base wordnet-sense-index)")
    root = build_wordnet_dir(tmp_path / "nltk_data")
    lexnames = (root / "corpora" / "wordnet" / "lexnames").read_text().splitlines()
    assert len(lexnames) == 45 and lexnames[3] == "03\tnoun.Tops\t1" and lexnames[44] == "44\tadj.ppl\t3"
    monkeypatch.setenv("BIGLM_WORDNET_DIR", str(root))
    wn = wordnet_reader()
    assert "carpet" in wn.synset("rug.n.01").lemma_names()
    assert wn.synset("dog.n.01").lexname() == "noun.animal"
