"""`biglm-serve` under load and at its limits, each against a real server subprocess: 64
concurrent clients x 4 requests (every request answered once, the metrics agree), SIGTERM in
the middle of a load (in-flight requests finish, later ones get 503, exit status 0), a full
queue (429 with Retry-After), lm-eval's own `local-completions` model scoring with `pll`
as the in-process `biglm` backend does, and a sentence-transformers export served with its own
prompts and pooling."""
from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from eval_fixtures import instances
from generation_model_fixtures import gen_checkpoint, gen_tokenizer_dir  # noqa: F401
from serve_fixtures import MODEL_NAME, serve

pytestmark = pytest.mark.slow

COMPLETIONS = '{endpoint="/v1/completions",status="%d"}'


def _count(metrics: dict, status: int) -> float:
    return metrics.get("biglm_requests_total" + COMPLETIONS % status, 0.0)


def test_64_clients_x_4_requests_are_each_answered_once_and_counted(gen_checkpoint):  # noqa: F811
    clients, per_client = 64, 4
    with serve(gen_checkpoint, "--max-queue", "256", "--max-rows", "64") as server:
        before = server.metrics()
        start = threading.Barrier(clients)

        def client(c):
            start.wait()
            session, got = requests.Session(), []
            for k in range(per_client):
                prompt = f"client {c} request {k}: To be, or not"
                r = session.post(server.url + "/v1/completions", timeout=300, json={
                    "model": MODEL_NAME, "prompt": prompt, "max_tokens": 4 + k, "temperature": 0.9,
                    "seed": c * per_client + k, "echo": True, "steps": 2, "block_size": 2})
                got.append((prompt, r.status_code, r.json()))
            return got

        with ThreadPoolExecutor(clients) as pool:
            answers = [a for batch in pool.map(client, range(clients)) for a in batch]
        after = server.metrics()
    assert len(answers) == clients * per_client
    assert all(status == 200 for _, status, _ in answers)
    assert len({body["id"] for _, _, body in answers}) == clients * per_client  # none duplicated
    for prompt, _, body in answers:  # each answer is its own request's
        assert len(body["choices"]) == 1 and body["choices"][0]["text"].startswith(prompt)
    assert _count(after, 200) - _count(before, 200) == clients * per_client
    generated = sum(body["usage"]["completion_tokens"] for _, _, body in answers)
    assert after["biglm_generated_tokens_total"] - before["biglm_generated_tokens_total"] >= generated
    # requests ran together: on average more than one row per block step
    steps = after["biglm_batch_rows_count"] - before["biglm_batch_rows_count"]
    assert (after["biglm_batch_rows_sum"] - before["biglm_batch_rows_sum"]) / steps > 2
    assert after["biglm_queue_length"] == 0 and after["biglm_running_rows"] == 0


def test_sigterm_during_load_finishes_in_flight_refuses_later_and_exits_0(gen_checkpoint):  # noqa: F811
    with serve(gen_checkpoint) as server:
        body = {"model": MODEL_NAME, "prompt": "Now is the winter", "max_tokens": 24, "steps": 12,
                "block_size": 2, "temperature": 0.5}

        def ask(seed):
            return requests.post(server.url + "/v1/completions", json=dict(body, seed=seed), timeout=300)

        with ThreadPoolExecutor(16) as pool:
            in_flight = [pool.submit(ask, s) for s in range(16)]
            t0 = time.monotonic()
            while time.monotonic() - t0 < 60:  # all 16 taken: running or waiting
                m = server.metrics()
                if m["biglm_running_rows"] + m["biglm_queue_length"] == 16:
                    break
                time.sleep(0.02)
            server.proc.send_signal(signal.SIGTERM)
            time.sleep(0.2)
            later = requests.post(server.url + "/v1/completions", json=dict(body, seed=99), timeout=60)
            answered = [f.result() for f in in_flight]
        assert later.status_code == 503 and "shutting down" in later.json()["error"]["message"]
        assert [r.status_code for r in answered] == [200] * 16
        assert all(len(r.json()["choices"][0]["token_ids"]) >= 1 for r in answered)
        assert server.proc.wait(timeout=60) == 0


@pytest.fixture(scope="module")
def full_attention_server(gen_checkpoint):  # noqa: F811
    """Full attention (no split sent by lm-eval), one running request, two waiting at most."""
    with serve(gen_checkpoint, "--split-attention", "off", "--max-queue", "2", "--max-rows", "1") as s:
        yield s


def test_a_full_queue_answers_429_with_retry_after(full_attention_server):
    server = full_attention_server
    start = threading.Barrier(12)

    def ask(seed):
        start.wait()
        return requests.post(server.url + "/v1/completions", timeout=300, json={
            "model": MODEL_NAME, "prompt": "Friends, Romans", "max_tokens": 32, "steps": 8,
            "block_size": 4, "seed": seed})

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(ask, range(12)))
    codes = sorted(r.status_code for r in answers)
    assert set(codes) == {200, 429} and codes.count(200) >= 1
    for r in answers:
        if r.status_code == 429:
            assert r.headers["Retry-After"] == "1" and "queue" in r.json()["error"]["message"]
    assert requests.get(server.url + "/health", timeout=30).status_code == 200


def test_lm_eval_local_completions_pll_equals_the_in_process_backend(full_attention_server,
                                                                      gen_checkpoint):  # noqa: F811
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    from megatron_biglm.evaluation.models import BiGLMEvalLM

    pairs = [("To be, or not to", " be"), ("To be, or not to", " sleep"),
             ("O Romeo, Romeo, wherefore art", " thou Romeo"), ("O Romeo, Romeo, wherefore art", " thee"),
             ("Now is the winter", " of our discontent"), ("Now is the winter", " of the king")]
    api = LocalCompletionsAPI(base_url=full_attention_server.v1 + "/completions", model=MODEL_NAME,
                              tokenizer_backend="remote", tokenized_requests=True, max_retries=1)
    served = api.loglikelihood(instances(pairs), disable_tqdm=True)
    lm = BiGLMEvalLM(path=str(gen_checkpoint), scoring="pll", split_attention="off", batch_size=4,
                     progress=False)
    local = lm.loglikelihood(instances(pairs))
    for (got, got_greedy), (want, want_greedy) in zip(served, local):
        assert got == pytest.approx(want, abs=1e-4)
        assert got_greedy == want_greedy
    # the multiple-choice answer (the best continuation of each context) agrees too
    assert [served[i][0] > served[i + 1][0] for i in (0, 2, 4)] == \
        [local[i][0] > local[i + 1][0] for i in (0, 2, 4)]


def test_a_sentence_transformers_export_is_served_with_its_prompts_and_pooling(gen_checkpoint, tmp_path):  # noqa: F811
    import torch
    from sentence_transformers import SentenceTransformer

    from megatron_biglm.export.sentence_transformers_dir import to_st

    export = to_st(gen_checkpoint, tmp_path / "st", pooling="cls", prompts={"query": "q: ", "passage": "p: "})
    texts = ["To be, or not to be", "O Romeo, Romeo, wherefore art thou"]
    st = SentenceTransformer(str(export), device="cpu")
    with serve(export) as server:
        for input_type in ("query", "passage"):
            r = server.post("/v1/embeddings", json={"model": MODEL_NAME, "input": texts, "input_type": input_type})
            got = torch.tensor([d["embedding"] for d in r.json()["data"]])
            want = st.encode(texts, prompt_name=input_type, convert_to_tensor=True).float()
            assert torch.allclose(got, want, atol=1e-5, rtol=0)
        r = server.post("/v1/completions", json={"model": MODEL_NAME, "prompt": texts[0], "max_tokens": 3})
        assert r.status_code == 200 and 1 <= len(r.json()["choices"][0]["token_ids"]) <= 3
