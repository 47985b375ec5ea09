"""Faults through a real `biglm-serve` subprocess and a real HTTP client: a request that fails
inside the model gets a 500 with an OpenAI-style error body and the server goes on serving; a
request that runs past the server's `--timeout` gets a 504.

How the model fails, without a switch made for tests: the served HF export's tokenizer holds
tokens added after export that have no row in the model's embedding (the mistake of calling
`tokenizer.add_tokens` without resizing the model). The server accepts their ids (they are
the tokenizer's), and the forward of a prompt that holds one fails in the embedding lookup, at
request time; prompts without them decode normally.
"""
from __future__ import annotations

import json
import shutil

import pytest
import requests
from generation_model_fixtures import gen_checkpoint, gen_export, gen_tokenizer_dir  # noqa: F401
from serve_fixtures import MODEL_NAME, serve

TIMEOUT_S = 1.5


@pytest.fixture(scope="module")
def unresized_export(gen_export, tmp_path_factory):  # noqa: F811
    """The export, its tokenizer grown past the model's embedding rows; the first id without a row."""
    from transformers import AutoConfig, AutoTokenizer

    out = tmp_path_factory.mktemp("unresized") / "hf"
    shutil.copytree(gen_export, out)
    rows = AutoConfig.from_pretrained(out).vocab_size
    tok = AutoTokenizer.from_pretrained(out)
    tok.add_tokens([f"<added{i}>" for i in range(rows - len(tok) + 2)])
    tok.save_pretrained(out)
    assert len(tok) > rows
    return out, rows


@pytest.fixture(scope="module")
def server(unresized_export):
    with serve(unresized_export[0], "--timeout", str(TIMEOUT_S)) as running:
        yield running


def _complete(server, **body):
    return server.post("/v1/completions", json={"model": MODEL_NAME, "max_tokens": 4, "steps": 2, **body})


def test_a_request_that_fails_inside_the_model_gets_500_and_the_server_goes_on(server, unresized_export):
    _, rows = unresized_export
    before = _complete(server, prompt="To be, or not to be")
    assert before.status_code == 200
    bad = _complete(server, prompt=[5, 6, rows])  # the tokenizer's id `rows` has no embedding row
    assert bad.status_code == 500
    error = bad.json()["error"]
    assert error["type"] == "server_error" and error["code"] == 500
    assert "the model failed on this request" in error["message"] and "index" in error["message"].lower()
    after = _complete(server, prompt="To be, or not to be")
    assert after.status_code == 200 and after.json()["choices"][0]["token_ids"] == \
        before.json()["choices"][0]["token_ids"]
    counts = server.metrics()
    assert counts['biglm_requests_total{endpoint="/v1/completions",status="500"}'] == 1


def test_a_request_past_the_timeout_gets_504_and_the_server_goes_on(server):
    # 256 candidate rows of ~110 slots, one block of 1 slot at a time: many seconds of work
    slow = _complete(server, prompt="To be", max_tokens=110, n=16, length_beam=16, block_size=1, steps=1,
                     temperature=1.0)
    assert slow.status_code == 504
    error = slow.json()["error"]
    assert error["type"] == "timeout" and "timeout" in error["message"]
    assert _complete(server, prompt="O Romeo, Romeo").status_code == 200
    # the timed-out request's rows were dropped: nothing is left running
    assert server.metrics()["biglm_running_rows"] == 0
    assert json.loads(requests.get(server.url + "/health", timeout=30).text)["status"] == "ok"


def test_block_causal_decoding_is_refused_for_an_hf_export(server):
    """An HF export keeps no keys/values between blocks: `blocks: cached` gets a 400 naming it."""
    r = _complete(server, prompt="To be", blocks="cached", block_size=2)
    assert r.status_code == 400 and r.json()["error"]["param"] == "blocks"
    assert "refresh" in r.json()["error"]["message"]
