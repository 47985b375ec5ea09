"""Faults through a real `biglm-serve` subprocess and a real HTTP client: a prompt holding a
token id the model cannot embed gets a 400 before any forward; a request that fails inside the
model gets a 500 with an OpenAI-style error body and the server goes on serving; a request that
runs past the server's `--timeout` gets a 504.

The served HF export's tokenizer holds tokens added after export that have no row in the model's
embedding (the mistake of calling `tokenizer.add_tokens` without resizing the model). Their ids
would fail in the embedding lookup (on a GPU, a device-side assert that breaks the CUDA context
for every later request), so the server refuses them, whether sent as ids or as text.

How the model fails, without a switch made for tests: a real out-of-memory. Once the server is
up, the test lowers the server process's address-space limit (`RLIMIT_AS`) to what it uses
plus a margin, and sends a request within the server's own limits whose batch needs more: the
allocation fails inside the forward (on a GPU the same path is CUDA's out-of-memory error).
"""
from __future__ import annotations

import contextlib
import json
import shutil

import psutil
import pytest
import requests
from generation_model_fixtures import gen_checkpoint, gen_export, gen_tokenizer_dir  # noqa: F401
from serve_fixtures import MODEL_NAME, serve

TIMEOUT_S = 1.5
#: address space the server may add while the big request runs: more than a small request needs
#: after warm-up (a few MB), less than the big request's batch (~280 MB on both stacks)
OOM_MARGIN = 96 * 2**20


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
    # on the CPU wherever the test runs: the out-of-memory it provokes is the host's
    with serve(unresized_export[0], "--timeout", str(TIMEOUT_S), "--device", "cpu") as running:
        yield running


def _complete(server, **body):
    return server.post("/v1/completions", json={"model": MODEL_NAME, "max_tokens": 4, "steps": 2, **body})


def test_a_prompt_id_without_an_embedding_row_gets_400_naming_it(server, unresized_export):
    _, rows = unresized_export
    before = _complete(server, prompt="To be, or not to be")
    assert before.status_code == 200
    cases = {"an id the tokenizer has but the model does not embed": ([5, 6, rows], 2, rows),
             "an id past the tokenizer": ([5, 10**6], 1, 10**6), "a negative id": ([-3, 5], 0, -3)}
    for what, (prompt, position, token) in cases.items():
        bad = _complete(server, prompt=[[5, 6], prompt])  # the second prompt of the request
        assert bad.status_code == 400, what
        error = bad.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == "prompt", what
        assert f"prompt 1 holds token id {token} at position {position}" in error["message"], what
        assert f"[0, {rows})" in error["message"], what
    text = _complete(server, prompt="To be <added0>")  # text that tokenizes to an id without a row
    assert text.status_code == 400 and "'<added0>'" in text.json()["error"]["message"]
    assert "without resizing the model" in text.json()["error"]["message"]
    scored = _complete(server, prompt=[5, rows], max_tokens=0, echo=True, logprobs=0)  # scoring too
    assert scored.status_code == 400 and scored.json()["error"]["param"] == "prompt"
    after = _complete(server, prompt="To be, or not to be")
    assert after.status_code == 200 and after.json()["choices"][0]["token_ids"] == \
        before.json()["choices"][0]["token_ids"]
    counts = server.metrics()
    assert counts['biglm_requests_total{endpoint="/v1/completions",status="400"}'] == len(cases) + 2
    warned = [line for line in server.log if "have no embedding row" in line]
    assert len(warned) == 1 and f"embeds {rows}" in warned[0]


@contextlib.contextmanager
def _address_space_limit(pid: int, margin: int):
    """The process `pid` may map only `margin` bytes more than it does now (its soft limit),
    until the block ends."""
    process = psutil.Process(pid)
    before = process.rlimit(psutil.RLIMIT_AS)
    process.rlimit(psutil.RLIMIT_AS, (process.memory_info().vms + margin, before[1]))
    try:
        yield
    finally:
        process.rlimit(psutil.RLIMIT_AS, before)


def test_a_request_that_fails_inside_the_model_gets_500_and_the_server_goes_on(server):
    small = dict(prompt="To be, or not to be", max_tokens=4, steps=2)
    before = _complete(server, **small)
    assert before.status_code == 200
    # 256 candidate rows of 110 slots in one block: ~300 MB of activations at once
    big = dict(prompt="To be", max_tokens=110, n=16, length_beam=16, steps=1, temperature=1.0)
    with _address_space_limit(server.proc.pid, OOM_MARGIN):
        failed = _complete(server, **big)
    assert failed.status_code == 500
    error = failed.json()["error"]
    assert error["type"] == "server_error" and error["code"] == 500
    assert "the model failed on this request" in error["message"]
    assert "allocate memory" in error["message"]  # torch's allocator, inside the forward
    assert server.proc.poll() is None
    after = _complete(server, **small)
    assert after.status_code == 200 and after.json()["choices"][0]["token_ids"] == \
        before.json()["choices"][0]["token_ids"]
    assert _complete(server, **big).status_code == 200  # the same request, with the memory it needs
    counts = server.metrics()
    assert counts['biglm_requests_total{endpoint="/v1/completions",status="500"}'] == 1
    assert counts["biglm_running_rows"] == 0


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
