"""BEIR-format evaluation: read a folder, encode (with a disk cache), exact search, score.

A BEIR folder holds corpus.jsonl ({"_id", "title"?, "text"}), queries.jsonl ({"_id", "text"})
and qrels/<split>.tsv (query-id, corpus-id, score; a header row, or none), read by the one row
reader (`data/rows.py`: .gz/.zst accepted): the first bad row, or a file that cannot be read
to its end, stops with file:line and what to write. An `_id` given twice is an error unless the
first is kept (`duplicate_ids="keep_first"`, counted); a grade is an integer, also when written
`1.0`. As in BEIR, a document is
"title text" when it has a title, and queries with no relevant document in the qrels are
skipped and counted. A query or document whose text is empty (after its title, for a
document) is skipped, counted and noted, never embedded: an empty query would be scored
against every document, and an empty document retrieved for no reason; the qrels judgments of
such a document are left out with it (counted). Search is exact (all query x document scores, top 100 kept). The metrics
come from pytrec_eval (trec_eval): ndcg_cut_10, recall_100, and recip_rank on the run cut
to the top 10 per query (= MRR@10).

The corpus embeddings are cached on disk under a key of (model id, corpus content hash,
embedding settings), so a second evaluation of the same model on the same corpus encodes
only the queries.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch

from megatron_biglm.data.rows import BadInputError, StopAtFirst, iter_rows, json_lines, open_binary

METRICS = ("ndcg@10", "recall@100", "mrr@10")


class BeirFormatError(ValueError):
    """A BEIR folder is missing a file or holds a malformed row; the message names it."""


@dataclass
class BeirSet:
    name: str
    corpus: dict            # doc id -> text
    queries: dict           # query id -> text (only those with a relevant document)
    qrels: dict             # query id -> {doc id: relevance}
    skipped_queries: int = 0
    notes: list = field(default_factory=list)
    empty_query_lines: list = field(default_factory=list)   # queries.jsonl lines of empty queries
    skipped_documents: int = 0                               # documents with empty text


def _records(path: Path, duplicate_ids: str, notes: list, keep_first_option: str) -> dict:
    """{id: (line, row)} of a corpus or queries file. An id given twice would silently let one row
    replace the other (and change the scores): it is an error naming both lines, or with
    `duplicate_ids="keep_first"` the first row is kept and the later ones counted in `notes`."""
    if not path.is_file():
        raise BeirFormatError(f"{path} is missing: a BEIR folder holds corpus.jsonl, queries.jsonl "
                              "and qrels/<split>.tsv")
    rows: dict = {}
    lines: dict = {}
    repeated = 0
    for number, row in json_lines(path, BeirFormatError, 'write one {"_id": ..., "text": ...} object per line'):
        if not isinstance(row, dict) or "_id" not in row or not isinstance(row.get("text"), str) or \
                not isinstance(row.get("title", ""), (str, type(None))):
            raise BeirFormatError(f'{path}:{number}: a row needs "_id" and a string "text" (and "title", when given, '
                                  'a string)')
        key = str(row["_id"])
        if key in rows:
            if duplicate_ids != "keep_first":
                raise BeirFormatError(f"{path}:{number}: _id {key!r} is already the id of line {lines[key]}; give "
                                      f"every row its own id, or set {keep_first_option} to keep the first row "
                                      "of each id (the later ones are counted)")
            repeated += 1
            continue
        rows[key], lines[key] = row, number
    if repeated:
        notes.append(f"{path.name}: {repeated} row(s) repeating an earlier _id were left out (the first kept)")
    return {key: (lines[key], row) for key, row in rows.items()}


def _non_empty(records: dict, text_of, path: Path, what: str, notes: list) -> tuple[dict, dict]:
    """({id: text} of the records with text, {id: line} of those without), the latter noted."""
    kept, empty = {}, {}
    for key, (line, row) in records.items():
        text = text_of(row)
        if text.strip():
            kept[key] = text
        else:
            empty[key] = line
    if empty:
        lines = sorted(empty.values())
        shown = ", ".join(map(str, lines[:10])) + (", ..." if len(lines) > 10 else "")
        notes.append(f"{path.name}: {len(empty)} {what} with empty text skipped (line(s) {shown})")
    return kept, empty


def _document_text(row: dict) -> str:
    """As BEIR joins them: "title text" when the document has a title."""
    return f"{row['title']} {row['text']}" if row.get("title") else row["text"]


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _relevance(text: str, path: Path, number: int) -> int:
    """A qrels grade: an integer, also when written as an integral float (`1.0`)."""
    value = _number(text)
    if value is None or not value.is_integer():
        raise BeirFormatError(f"{path}:{number}: relevance {text.strip()!r} is not a whole number; qrels "
                              "grades are integers (0 = not relevant, 1, 2, ... = relevant)")
    return int(value)


QRELS_HINT = "write query-id, corpus-id and an integer score per line, tab-separated"


def read_qrels(path: Path) -> dict:
    if not path.is_file():
        raise BeirFormatError(f"{path} is missing: pass --split with a file under qrels/")
    qrels: dict = {}
    rows = iter_rows(path, fmt="tsv", skips=StopAtFirst(BeirFormatError, QRELS_HINT))
    try:
        for number, cells in _qrels_cells(path, rows):
            if len(cells) < 3 or any(c is None for c in cells[:3]):
                raise BeirFormatError(f"{path}:{number}: expected query-id, corpus-id, score; {QRELS_HINT}")
            qrels.setdefault(str(cells[0]), {})[str(cells[1])] = _relevance(str(cells[2]), path, number)
    except BadInputError as exc:  # a file that cannot be read to its end
        raise BeirFormatError(f"{exc}; {QRELS_HINT}") from None
    return qrels


def _qrels_cells(path: Path, rows) -> Iterator[tuple[int, list]]:
    """(line, cells) of every qrels row. The reader takes the first line as the header; when
    that line's score is a number it was a row (a qrels file without a header) and is kept."""
    header = None
    for row in rows:
        if header is None:
            header = list(row.value)
            if _is_row(header):
                yield 1, header
        yield row.line, list(row.value.values())
    if header is None:  # one line at most: the header the reader took, or a single row
        with open_binary(path) as fh:
            first = fh.readline().decode("utf-8-sig", errors="replace").rstrip("\r\n").split("\t")
        if _is_row(first):
            yield 1, first


def _is_row(cells: list) -> bool:
    return len(cells) >= 3 and _number(str(cells[2])) is not None


def load_beir(folder, split: str = "test", *, unknown_documents: str = "error",
              duplicate_ids: str = "error", keep_first_option: str = "--keep-first-duplicate",
              skip_unknown_option: str | None = "--skip-unknown-documents") -> BeirSet:
    """The folder's corpus, the queries with a relevant document and their qrels. A qrels row
    naming a document the corpus lacks could never be retrieved and would score 0 silently: it
    is an error, or with `unknown_documents="skip"` a counted note (the row left out). (A
    judgment of relevance 0 changes no score and is kept as it is.) A repeated `_id` is an
    error naming `keep_first_option` (the caller's way to opt in: a flag or a config key), or with
    `duplicate_ids="keep_first"` a counted note. `skip_unknown_option`: the caller's way to skip
    unknown documents, named in that error (None: the caller has none)."""
    folder = Path(folder)
    notes: list = []
    corpus, empty_docs = _non_empty(_records(folder / "corpus.jsonl", duplicate_ids, notes, keep_first_option),
                                    _document_text, folder / "corpus.jsonl", "document(s)", notes)
    if not corpus:
        raise BeirFormatError(f"{folder / 'corpus.jsonl'} holds no document with text: retrieval needs a corpus "
                              "to search")
    queries, empty_queries = _non_empty(_records(folder / "queries.jsonl", duplicate_ids, notes, keep_first_option),
                                        lambda r: r["text"], folder / "queries.jsonl", "query(ies)", notes)
    if not queries:
        raise BeirFormatError(f"{folder / 'queries.jsonl'} holds no query with text: write one "
                              '{"_id": ..., "text": ...} object per line for each query the qrels judge')
    qrels = read_qrels(folder / "qrels" / f"{split}.tsv")
    if empty_docs:
        judged = sum(doc in empty_docs for rels in qrels.values() for doc in rels)
        qrels = {q: {d: v for d, v in rels.items() if d not in empty_docs} for q, rels in qrels.items()}
        if judged:
            notes.append(f"qrels/{split}.tsv: {judged} judgment(s) of documents with empty text left out")
    missing = sorted({doc for rels in qrels.values() for doc, v in rels.items() if v > 0 and doc not in corpus})
    if missing and unknown_documents != "skip":
        raise BeirFormatError(f"{folder}/qrels/{split}.tsv names {len(missing)} document(s) that corpus.jsonl "
                              f"lacks (e.g. {missing[:3]}); fix the qrels or the corpus"
                              + (f", or pass {skip_unknown_option} to leave those rows out (counted)"
                                 if skip_unknown_option else ""))
    if missing:
        qrels = {q: {d: v for d, v in rels.items() if d in corpus or v <= 0} for q, rels in qrels.items()}
    result = BeirSet(folder.name, corpus, {}, {}, notes=notes, skipped_documents=len(empty_docs),
                     empty_query_lines=sorted(empty_queries.values()))
    if missing:
        result.notes.append(f"{len(missing)} qrels document id(s) not in the corpus were left out")
    for qid, rels in qrels.items():
        if qid in empty_queries:  # noted above, with its line
            result.skipped_queries += 1
        elif qid not in queries:
            result.notes.append(f"qrels query {qid} is not in queries.jsonl")
            result.skipped_queries += 1
        elif not any(v > 0 for v in rels.values()):
            result.skipped_queries += 1
        else:
            result.queries[qid], result.qrels[qid] = queries[qid], rels
    if not result.queries:
        raise BeirFormatError(f"{folder}: no query of qrels/{split}.tsv has a relevant document")
    return result


def corpus_key(model_id: str, corpus: dict, settings: str = "") -> str:
    digest = hashlib.sha256()
    for doc_id in sorted(corpus):
        digest.update(doc_id.encode() + b"\0" + corpus[doc_id].encode() + b"\0")
    return hashlib.sha256(f"{model_id}|{digest.hexdigest()}|{settings}".encode()).hexdigest()[:32]


def cached_corpus_embeddings(encode_passages: Callable, corpus: dict, cache_dir, key: str):
    """(doc ids, embeddings [n, h]) from cache_dir/key.pt or freshly encoded (then stored)."""
    ids = sorted(corpus)
    path = Path(cache_dir) / f"corpus-{key}.pt" if cache_dir else None
    if path is not None and path.is_file():
        cached = torch.load(path)
        if cached["ids"] == ids:
            return ids, cached["embeddings"], True
    embeddings = encode_passages([corpus[i] for i in ids])
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save({"ids": ids, "embeddings": embeddings}, tmp)
        tmp.replace(path)
    return ids, embeddings, False


def exact_search(query_emb: torch.Tensor, doc_emb: torch.Tensor, query_ids, doc_ids, top_k: int = 100) -> dict:
    """{query id: {doc id: score}} of the top_k documents by dot product (cosine if normalised)."""
    scores = query_emb.float() @ doc_emb.float().T
    k = min(top_k, len(doc_ids))
    values, indices = scores.topk(k, dim=1)
    return {qid: {doc_ids[j]: float(v) for v, j in zip(values[row].tolist(), indices[row].tolist())}
            for row, qid in enumerate(query_ids)}


def score_run(qrels: dict, run: dict) -> dict:
    """nDCG@10, Recall@100 and MRR@10 (means over the qrels' queries) by pytrec_eval."""
    import pytrec_eval  # lazy: optional (retrieval extra)

    full = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"}).evaluate(run)
    top10 = {q: dict(sorted(docs.items(), key=lambda kv: (-kv[1], kv[0]))[:10]) for q, docs in run.items()}
    mrr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)
    n = len(qrels)
    return {"ndcg@10": sum(full.get(q, {}).get("ndcg_cut_10", 0.0) for q in qrels) / n,
            "recall@100": sum(full.get(q, {}).get("recall_100", 0.0) for q in qrels) / n,
            "mrr@10": sum(mrr.get(q, {}).get("recip_rank", 0.0) for q in qrels) / n}


def evaluate_beir(encoder, folder, *, split: str = "test", cache_dir=None, batch_size: int = 32,
                  progress: bool = True, unknown_documents: str = "error", duplicate_ids: str = "error") -> dict:
    """Metrics of `encoder` (an object with encode_queries/encode_passages(texts, batch_size,
    progress) and an `identity` string) on one BEIR folder, plus counts."""
    data = load_beir(folder, split, unknown_documents=unknown_documents, duplicate_ids=duplicate_ids)
    key = corpus_key(encoder.identity, data.corpus)
    doc_ids, doc_emb, hit = cached_corpus_embeddings(
        lambda texts: encoder.encode_passages(texts, batch_size=batch_size, progress=progress),
        data.corpus, cache_dir, key)
    query_ids = sorted(data.queries)
    query_emb = encoder.encode_queries([data.queries[q] for q in query_ids], batch_size=batch_size,
                                       progress=False)
    run = exact_search(query_emb, doc_emb, query_ids, doc_ids)
    metrics = score_run(data.qrels, run)
    return {**metrics, "queries": len(query_ids), "skipped_queries": data.skipped_queries,
            "documents": len(doc_ids), "skipped_documents": data.skipped_documents, "corpus_cache_hit": hit, "notes": data.notes}
