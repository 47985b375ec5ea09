"""`biglm-serve` against real clients: one server subprocess (a megatron checkpoint, split attention
as trained, the exact prefix cache) shared by the module; the `openai` package for well-formed
requests, plain HTTP for malformed ones.

What is compared: greedy completions with `biglm-generate`'s ids; concurrent sampled requests
with each request alone; streamed blocks with the whole text; embeddings with
sentence-transformers' encode of the `to-st` export; chat with the completion of the templated
prompt; scores with the in-process `biglm` lm-eval backend; each bad input with its status and
the field it names; the README's client snippet, run as written.
"""
from __future__ import annotations

import io
import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from eval_fixtures import instances
from generation_model_fixtures import gen_checkpoint, gen_tokenizer_dir  # noqa: F401
from serve_fixtures import MODEL_NAME, serve

openai = pytest.importorskip("openai")

PROMPTS = ["To be, or not to be", "O Romeo, Romeo", "Now is the winter of our discontent",
           "Friends, Romans, countrymen"]


@pytest.fixture(scope="module")
def server(gen_checkpoint):  # noqa: F811
    with serve(gen_checkpoint) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=120)


def _ids(choice) -> list[int]:
    return list(choice.model_extra["token_ids"])


def test_models_health_and_tokenizer_endpoints(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL_NAME]
    assert requests.get(server.url + "/health", timeout=30).json()["status"] == "ok"
    info = requests.get(server.url + "/tokenizer_info", timeout=30).json()
    assert info["model_max_length"] == 128 and info["mask_token"]
    ids = server.post("/tokenize", json={"prompt": PROMPTS[0]}).json()["tokens"]
    assert server.post("/detokenize", json={"tokens": ids}).json()["prompt"] == PROMPTS[0]


@pytest.mark.parametrize("blocks", ["refresh", "cached"])
def test_greedy_completion_equals_biglm_generate(client, gen_checkpoint, tmp_path, blocks):  # noqa: F811
    """The server keeps each request's prefix in a pool slot (rewritten per block, or grown
    block-causally with `blocks: cached`); `biglm-generate` uses the growing cache."""
    from megatron_biglm.cli.generate import main as generate

    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:2]))
    code = generate(["--model", str(gen_checkpoint), "--input", str(src), "--output", str(out),
                     "--max-new-tokens", "9", "--steps", "3", "--block-size", "4", "--batch-size", "1",
                     "--blocks", blocks, "--no-progress"], stdout=io.StringIO(), stderr=io.StringIO())
    assert code == 0
    want = [json.loads(x) for x in out.read_text().splitlines()]
    for prompt, row in zip(PROMPTS[:2], want):
        got = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=9, temperature=0,
                                        extra_body={"steps": 3, "block_size": 4, "blocks": blocks}).choices[0]
        assert _ids(got) == row["ids"] and got.text == row["text"]
        assert got.finish_reason == ("length" if row["finish_reason"] == "length" else "stop")


def _mixed_requests():
    out = []
    for i, prompt in enumerate(PROMPTS * 2):
        out.append(dict(prompt=prompt, max_tokens=6 + i % 3, temperature=[0.0, 0.8, 1.0][i % 3],
                        seed=i, n=1 + i % 2,
                        extra_body={"steps": 2 + i % 3, "block_size": [None, 3, 4][i % 3],
                                    "remasking": ["low_confidence", "random"][i % 2],
                                    "blocks": ["refresh", "cached"][i // 4]}))
    return out


def test_mixed_batch_with_seeds_equals_each_request_alone(server, client):
    asks = _mixed_requests()
    before = server.metrics()
    start = threading.Barrier(len(asks))

    def ask(kwargs):
        start.wait()
        return client.completions.create(model=MODEL_NAME, **kwargs)

    with ThreadPoolExecutor(len(asks)) as pool:
        together = list(pool.map(ask, asks))
    after = server.metrics()
    alone = 'biglm_batch_rows_bucket{le="1"}'
    shared = (after["biglm_batch_rows_count"] - before["biglm_batch_rows_count"]) - (after[alone] - before[alone])
    assert shared >= 1, "no block step decoded two of the concurrent requests together"
    for kwargs, batched in zip(asks, together):
        alone = client.completions.create(model=MODEL_NAME, **kwargs)
        assert [_ids(c) for c in batched.choices] == [_ids(c) for c in alone.choices]
        assert len(batched.choices) == kwargs["n"]
    # a seed changes a sampled answer
    kwargs = dict(asks[1], n=1)
    other = client.completions.create(model=MODEL_NAME, **dict(kwargs, seed=99))
    assert _ids(other.choices[0]) != _ids(client.completions.create(model=MODEL_NAME, **kwargs).choices[0])


def test_stream_sends_blocks_in_order_that_concatenate_to_the_text(client):
    kwargs = dict(model=MODEL_NAME, prompt=PROMPTS[2], max_tokens=12, temperature=0,
                  extra_body={"steps": 2, "block_size": 4})
    whole = client.completions.create(**kwargs).choices[0]
    chunks = list(client.completions.create(stream=True, **kwargs))
    texts = [c.choices[0].text for c in chunks]
    assert "".join(texts) == whole.text
    assert 1 <= len(texts) <= 3 + 1  # at most one event per block, plus the closing one
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_embeddings_equal_sentence_transformers_encode_of_the_export(client, gen_checkpoint, tmp_path):  # noqa: F811
    pytest.importorskip("sentence_transformers")
    import torch
    from sentence_transformers import SentenceTransformer

    from megatron_biglm.export.sentence_transformers_dir import to_st

    st = SentenceTransformer(str(to_st(gen_checkpoint, tmp_path / "st")), device="cpu")
    texts = PROMPTS + ["a much longer passage about kings, queens and the winter of discontent " * 2]
    plain = None
    for input_type in (None, "query", "passage"):
        extra = {} if input_type is None else {"extra_body": {"input_type": input_type}}
        got = client.embeddings.create(model=MODEL_NAME, input=texts, **extra)  # base64, the default
        want = st.encode(texts, prompt_name=input_type, convert_to_tensor=True).float()
        served = torch.tensor([d.embedding for d in got.data])
        assert served.shape == want.shape
        assert torch.allclose(served, want, atol=1e-5, rtol=0)
        plain = served if plain is None else plain
    floats = client.embeddings.create(model=MODEL_NAME, input=texts[0], encoding_format="float")
    assert torch.allclose(torch.tensor(floats.data[0].embedding), plain[0], atol=1e-6)
    # past the model's 128 tokens: refused naming both lengths, or cut as the export cuts it when asked
    longer = texts[-1] * 4  # past 128 tokens
    with pytest.raises(openai.BadRequestError, match=r"input 1 is (\d+) tokens .*more than the 128 this model "
                                                     r"embeds.*truncate: true") as refused:
        client.embeddings.create(model=MODEL_NAME, input=[texts[0], longer])
    assert int(re.search(r"input 1 is (\d+) tokens", str(refused.value)).group(1)) > 128
    cut = client.embeddings.create(model=MODEL_NAME, input=[longer], extra_body={"truncate": True})
    want = st.encode([longer], convert_to_tensor=True).float()
    assert torch.allclose(torch.tensor(cut.data[0].embedding), want[0], atol=1e-5, rtol=0)
    assert cut.usage.prompt_tokens == 128
    with pytest.raises(openai.BadRequestError, match="input_type"):
        client.embeddings.create(model=MODEL_NAME, input="x", extra_body={"input_type": "poem"})


def test_chat_is_the_completion_of_the_instruction_template(client):
    from megatron_biglm.finetune.instruct.chat_template import prompt_of

    ask = "Name the prince of Denmark"
    extra = {"steps": 3, "block_size": 4}
    chat = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": ask}],
                                          max_tokens=8, temperature=0, extra_body=extra)
    plain = client.completions.create(model=MODEL_NAME, prompt=prompt_of(ask, "default"), max_tokens=8,
                                      temperature=0, extra_body=extra)
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == plain.choices[0].text
    assert _ids(chat.choices[0]) == _ids(plain.choices[0])
    stream = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": ask}],
                                            max_tokens=8, temperature=0, extra_body=extra, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == plain.choices[0].text
    assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason
    with pytest.raises(openai.BadRequestError, match="one user message"):
        client.chat.completions.create(model=MODEL_NAME, max_tokens=4, messages=[
            {"role": "system", "content": "be brief"}, {"role": "user", "content": ask}])


def _pairs(tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    pairs = [("To be, or not to", " be"), ("O Romeo, Romeo, wherefore art", " thou Romeo"),
             ("Now is the winter", " of our discontent")]
    return tok, pairs


@pytest.mark.parametrize("rule", ["beam", "oneshot", "pll"])
def test_scoring_equals_the_in_process_biglm_backend(server, gen_checkpoint, gen_tokenizer_dir, rule):  # noqa: F811
    from megatron_biglm.evaluation.models import BiGLMEvalLM

    lm = BiGLMEvalLM(path=str(gen_checkpoint), scoring=rule, beam=2 if rule == "beam" else 1,
                     batch_size=4, progress=False)
    _, pairs = _pairs(gen_tokenizer_dir)
    want = lm.loglikelihood(instances(pairs))
    for (context, continuation), (logprob, greedy) in zip(pairs, want):
        ctx, cont = lm.encode_pair(context, continuation)
        body = {"model": MODEL_NAME, "prompt": ctx + cont, "max_tokens": 0, "echo": True, "logprobs": 1,
                "scoring": rule, "context_tokens": len(ctx), "beam": 2 if rule == "beam" else 1}
        got = server.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
        assert got["score"]["logprob"] == pytest.approx(logprob, abs=1e-4)
        assert got["score"]["is_greedy"] == greedy
        assert got["token_logprobs"][:len(ctx)] == [None] * len(ctx)
        if rule != "beam":  # sums of one term per token: the terms come back per token
            assert sum(got["token_logprobs"][len(ctx):]) == pytest.approx(logprob, abs=1e-4)


@pytest.mark.parametrize("body, field, words", [
    ("{not json", None, "not valid JSON"),
    ({"model": MODEL_NAME, "prompt": "a", "colour": "red"}, "colour", "unknown field"),
    ({"model": MODEL_NAME, "prompt": "a", "max_tokens": "5"}, "max_tokens", "integer"),
    ({"model": MODEL_NAME, "prompt": "a", "max_tokens": -1}, "max_tokens", "greater than or equal"),
    ({"model": MODEL_NAME, "prompt": "a", "temperature": 2.5}, "temperature", "less than or equal"),
    ({"model": "gpt-4", "prompt": "a"}, "model", "unknown model 'gpt-4'"),
    ({"model": MODEL_NAME}, "prompt", "required"),
    ({"model": MODEL_NAME, "prompt": "a", "remasking": "sideways"}, "remasking", "low_confidence"),
    ({"model": MODEL_NAME, "prompt": [1, 2, 10 ** 6]}, "prompt", "token id 1000000 at position 2, outside"),
    ({"model": MODEL_NAME, "prompt": [[1], [-1, 2]]}, "prompt", "prompt 1 holds token id -1 at position 0"),
    ({"model": MODEL_NAME, "prompt": "a", "max_tokens": 0}, "max_tokens", "echo=true"),
    ({"model": MODEL_NAME, "prompt": ["a", "b"], "stream": True}, "stream", "one completion"),
    ({"model": MODEL_NAME, "prompt": "a", "stream": True, "n": 2}, "stream", "n=1"),
    ({"model": MODEL_NAME, "prompt": "a", "stream": True, "logprobs": 1}, "logprobs", "not streamed"),
    ({"model": MODEL_NAME, "prompt": "a", "n": 0}, "n", "greater than or equal"),
    ({"model": MODEL_NAME, "prompt": "a", "steps": 0}, "steps", "greater than or equal"),
    ({"model": MODEL_NAME, "prompt": "a", "scoring": "vibes"}, "scoring", "pll"),
    ({"model": MODEL_NAME, "prompt": "a", "stop": ""}, "stop", "stop holds an empty string"),
    ({"model": MODEL_NAME, "prompt": "a", "stop": ["\n", ""]}, "stop", "stop holds an empty string"),
])
def test_bad_requests_get_400_naming_the_field(server, body, field, words):
    data = body if isinstance(body, str) else json.dumps(body)
    r = server.post("/v1/completions", data=data, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and words in error["message"]
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("ids, position, token", [([5, -1], 1, -1), ([10**6, 5], 0, 10**6)],
                         ids=["negative", "past the tokenizer"])
def test_detokenize_of_an_id_outside_the_tokenizer_gets_400_naming_it(server, ids, position, token):
    r = server.post("/detokenize", json={"tokens": ids})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "tokens"
    assert f"tokens holds id {token} at position {position}, outside this tokenizer's ids [0, " in error["message"]


def _ids_body(count: int) -> bytes:
    return json.dumps({"model": MODEL_NAME, "prompt": [5] * count, "max_tokens": 1}).encode()


def test_a_body_past_the_limit_gets_413_before_it_is_parsed(server):
    """The default limit is 1 MiB: a body that declares more is refused before it is read, one sent
    in chunks without a length as soon as it passes the limit; the server goes on serving."""
    body = _ids_body((2 << 20) // 3)  # "5, " per id: about 2 MiB
    assert len(body) > 1 << 20
    declared = server.post("/v1/completions", data=body, headers={"Content-Type": "application/json"})
    assert declared.status_code == 413, declared.text
    message = declared.json()["error"]["message"]
    assert f"of {len(body):,} bytes is larger than this server's limit of 1,048,576 bytes" in message
    assert "--max-request-bytes" in message

    def chunks():
        step = 64 << 10
        for start in range(0, len(body), step):
            yield body[start:start + step]

    chunked = server.post("/v1/completions", data=chunks(), headers={"Content-Type": "application/json"})
    assert chunked.status_code == 413, chunked.text
    assert "larger than this server's limit of 1,048,576 bytes" in chunked.json()["error"]["message"]
    small = _ids_body(10)
    assert server.post("/v1/completions", data=small, headers={"Content-Type": "application/json"}).status_code == 200
    assert server.metrics()['biglm_requests_total{endpoint="/v1/completions",status="413"}'] == 2


def test_a_prompt_longer_than_the_model_gets_400_naming_both_lengths(server):
    r = server.post("/v1/completions", json={"model": MODEL_NAME, "prompt": list(range(5, 125)),
                                             "max_tokens": 16})
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "120 tokens" in message and "model's length 128" in message


def test_a_client_that_disconnects_frees_its_rows(server, client):
    before = server.metrics().get('biglm_requests_total{endpoint="/v1/completions",status="499"}', 0)
    with pytest.raises(requests.exceptions.Timeout):
        # 55 blocks of ~50 iterations: far longer than the client waits
        server.post("/v1/completions", json={"model": MODEL_NAME, "prompt": PROMPTS[0], "max_tokens": 110,
                                             "steps": 100, "block_size": 2}, timeout=1.0)
    deadline = 30.0
    import time

    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline:
        m = server.metrics()
        if m["biglm_running_rows"] == 0 and m.get(
                'biglm_requests_total{endpoint="/v1/completions",status="499"}', 0) == before + 1:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the abandoned request still runs: {m}")
    got = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[1], max_tokens=2, temperature=0)
    assert len(_ids(got.choices[0])) <= 2


def test_readme_snippet_runs_as_written(server):
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Serve a model", 1)[1]
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    import os
    import subprocess
    import sys

    env = dict(os.environ, BIGLM_URL=server.v1)
    done = subprocess.run([sys.executable, "-c", snippet], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()


def _health_waits_while(server, send) -> tuple[list[float], object]:
    """The seconds each /health call took, asked every 50 ms while `send()` runs in a thread; its answer."""
    import time

    answer: dict = {}
    sender = threading.Thread(target=lambda: answer.update(r=send()))
    sender.start()
    waits = []
    while sender.is_alive():
        start = time.monotonic()
        assert requests.get(server.url + "/health", timeout=30).json()["status"] == "ok"
        waits.append(time.monotonic() - start)
        time.sleep(0.05)
    sender.join()
    return waits, answer["r"]


def test_health_answers_within_a_second_while_a_16_mb_request_arrives(server):
    """16 MB of token ids sent in chunks are counted as they arrive and refused at the limit,
    unparsed: /health, asked every 50 ms meanwhile, answers each time within a second."""
    body = _ids_body((16 << 20) // 3)

    def chunked():
        step = 256 << 10
        return server.post("/v1/completions", data=(body[i:i + step] for i in range(0, len(body), step)),
                           headers={"Content-Type": "application/json"})

    waits, answer = _health_waits_while(server, chunked)
    assert answer.status_code == 413, answer.text
    assert max(waits) < 1.0, waits


@pytest.mark.slow  # its own server (a raised limit): ~20 s
def test_health_answers_within_a_second_while_a_large_request_is_checked(gen_checkpoint):  # noqa: F811
    """4 MB of token ids under a raised --max-request-bytes are parsed and checked off the event
    loop: /health, asked every 50 ms meanwhile, answers each time within a second."""
    body = _ids_body((4 << 20) // 3)
    with serve(gen_checkpoint, "--max-request-bytes", str(8 << 20)) as big:
        waits, answer = _health_waits_while(big, lambda: big.post(
            "/v1/completions", data=body, headers={"Content-Type": "application/json"}))
    assert answer.status_code == 400 and "more than the model's length 128" in answer.text
    assert len(waits) >= 3, f"the request was answered within {len(waits)} health checks; send more"
    assert max(waits) < 1.0, waits
