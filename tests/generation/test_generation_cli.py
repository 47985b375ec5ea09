"""`python -m megatron_biglm.cli.generate` (megatron_biglm.cli.generate.main): JSONL in, one row per prompt out,
the canvas per iteration with --show-steps, and every bad input refused with a
clear message and exit status 2."""
from __future__ import annotations

import io
import json
import shutil

import pytest
from eval_fixtures import one_torch_thread  # noqa: F401
from generation_model_fixtures import gen_checkpoint, gen_export, gen_tokenizer_dir  # noqa: F401

from megatron_biglm.generation import GenerationConfig, MaskPredictGenerator
from megatron_biglm.cli.generate import main

LONG = " ".join(["the king is dead, long live the king"] * 40)


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    code = main([str(a) for a in argv], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_jsonl_rows_in_order_match_the_python_api(gen_export, tmp_path):
    prompts = ["To be, or not to be", "O Romeo, Romeo", "To be, or not to be", "Now is the winter"]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps({"prompt": p}) for p in prompts[:3]) + "\n"
                   + json.dumps(prompts[3]) + "\n")
    code, _, err = run(["--model", gen_export, "--input", src, "--output", tmp_path / "out.jsonl",
                        "--length", 6, "--steps", 3, "--batch-size", 3, "--temperature", 0.7,
                        "--seed", 4, "--no-progress"])
    assert code == 0, err
    rows = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in rows] == prompts
    for key in ("prompt", "text", "ids", "confidence", "iterations"):
        assert all(key in r for r in rows)
    gen = MaskPredictGenerator.from_pretrained(gen_export)
    want = gen.generate(prompts, GenerationConfig(length=6, steps=3, temperature=0.7, seed=4))
    assert [r["ids"] for r in rows] == [o.ids for o in want]
    assert [len(r["ids"]) for r in rows] == [6] * 4 and rows[0]["iterations"] == 3


def test_show_steps_prints_the_canvas_filling_in(gen_export):
    code, out, err = run(["--model", gen_export, "--prompt", "To be, or not to be", "--length", 4,
                          "--steps", 4, "--show-steps"])
    assert code == 0, err
    lines = [x for x in err.splitlines() if x.startswith("block 0 iter")]
    assert len(lines) == 4
    assert [x.count("_") for x in lines] == [3, 2, 1, 0]  # floor(N (T - t) / T) masks left
    assert out.startswith("To be, or not to be")


def test_over_long_prompt_is_refused_or_truncated_and_counted(gen_export, tmp_path):
    code, _, err = run(["--model", gen_export, "--prompt", LONG, "--length", 4])
    assert code == 2 and "overflow" in err and "truncate_left" in err
    code, _, err = run(["--model", gen_export, "--prompt", LONG, "--length", 4,
                        "--overflow", "truncate_left", "--output", tmp_path / "o.jsonl"])
    assert code == 0, err
    row = json.loads((tmp_path / "o.jsonl").read_text())
    assert row["prompt_tokens_dropped"] > 0 and "truncated from the left" in err


@pytest.mark.parametrize("argv,message", [
    (["--prompt", "", "--length", 4], "empty"),
    (["--prompt", "Hi", "--length", 0], "length must be >= 1"),
    (["--prompt", "Hi", "--length", 4, "--steps", 0], "steps must be >= 1"),
    (["--prompt", "Hi", "--length-beam", 3], "no length head"),
    (["--prompt", "Hi", "--length", 4, "--set", "temprature=1"], "did you mean 'temperature'"),
    (["--prompt", "Hi", "--length", 4, "--set", "nonsense"], "KEY=VALUE"),
    (["--prompt", "Hi", "--length", 4, "--top-k", 5], "set temperature > 0"),
], ids=["empty", "length0", "steps0", "beam-no-length", "unknown-option", "bad-set", "topk-greedy"])
def test_bad_input_exits_2_with_a_message(gen_export, argv, message):
    code, _, err = run(["--model", gen_export, *argv])
    assert code == 2 and message in err and err.startswith("error: ")


def test_bad_files_and_flags_exit_2(gen_export, tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"text": "no prompt key"}\n')
    code, _, err = run(["--model", gen_export, "--input", tmp_path / "bad.jsonl",
                        "--output", tmp_path / "o.jsonl", "--length", 2])
    assert code == 2 and "prompt" in err
    code, _, err = run(["--model", tmp_path, "--prompt", "Hi", "--length", 2])
    assert code == 2 and "neither an exported HF directory" in err
    with pytest.raises(SystemExit) as exc:  # an unknown flag: argparse's own status 2
        run(["--model", gen_export, "--prompt", "Hi", "--colour", "red"])
    assert exc.value.code == 2


def test_tokenizer_without_mask_token_is_refused(gen_export, tmp_path):
    from transformers import AutoTokenizer

    model = tmp_path / "nomask"
    shutil.copytree(gen_export, model)
    tok = AutoTokenizer.from_pretrained(str(gen_export))
    tok.mask_token = None
    tok.save_pretrained(str(model))
    assert AutoTokenizer.from_pretrained(str(model)).mask_token_id is None
    code, _, err = run(["--model", model, "--prompt", "Hi", "--length", 2])
    assert code == 2 and "mask token" in err
