"""CPU shims (patches.apply_cpu): each one's failure without it, and megatron-core training
with all of them bit-identical to plain PyTorch. Every megatron run is a subprocess, so the
global patches never reach the pytest process."""
from __future__ import annotations

import functools
import json
import logging
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from no_cuda import torch_no_cuda_errors

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "tests" / "fixtures" / "patches_cpu_scenarios.py"
NO_CUDA = "no CUDA"  # the installed torch build's own error for a CUDA call (no_cuda.py)

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-shim tests")


def run_scenarios(*names: str, skip=()) -> dict:
    cmd = [sys.executable, str(SCENARIOS), *names, "--skip", *skip]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("SCENARIO_RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("SCENARIO_RESULT "):])


@pytest.fixture(scope="module")
def with_all_shims():
    """Every positive scenario, in one subprocess with all shims applied."""
    return run_scenarios("train_step", "train_step_distopt", "rng", "streams")


def run_python(code: str) -> dict:
    """Run code in a fresh interpreter (repo root on sys.path); it prints one JSON line."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("scenario", ["train_step", "train_step_distopt"])
def test_megatron_step_on_cpu_is_bit_identical_to_plain_torch(with_all_shims, scenario):
    r = with_all_shims[scenario]
    assert "error" not in r, r
    assert with_all_shims["applied"] == [
        "cpu_current_device", "cpu_synchronize", "cpu_streams", "cpu_device_mode",
        "cpu_tensor_type", "cpu_rng_tracker",
    ]
    assert r["loss"] == r["ref_loss"]
    assert r["grad_norm"] == pytest.approx(r["ref_grad_norm"], rel=1e-6)
    assert r["max_param_diff"] == 0.0  # clip (0.5 < norm) + AdamW step, bit for bit
    assert r["min_update_size"] > 1e-3  # every parameter actually moved
    assert r["grad_buffer_devices"] == ["cpu"]


def test_cpu_rng_tracker_keeps_megatron_rng_semantics(with_all_shims):
    r = with_all_shims["rng"]
    assert r["tracker_class"] == "CpuRNGStatesTracker"
    assert r["tp_draw_matches_seed_plus_2718"]  # megatron's model-parallel seed
    assert r["tp_stream_continues"]  # a second fork resumes, does not restart
    assert r["default_stream_untouched_by_fork"]
    assert r["recompute_mask_matches"]  # activation recompute replays the same dropout
    assert 0.4 < r["dropout_fraction"] < 0.6


def test_cpu_streams_let_megatron_set_up_and_use_streams(with_all_shims):
    r = with_all_shims["streams"]
    assert r["product"] == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert r["stream_type"] == "CpuStream"


# (shim left out, scenario, error type, error text, deepest megatron frame)
FAILURES_WITHOUT = [
    ("cpu_current_device", "train_step", None, NO_CUDA,
     "megatron/core/distributed/param_and_grad_buffer.py:__init__"),
    ("cpu_device_mode", "train_step", None, NO_CUDA,
     "megatron/core/optimizer/optimizer.py:__init__"),
    ("cpu_tensor_type", "train_step", "AssertionError", "",
     "megatron/core/optimizer/clip_grads.py:clip_grad_by_total_norm_fp32"),
    ("cpu_tensor_type", "train_step_distopt", "TypeError",
     "Wrapped parameters must be one of torch.cuda.FloatTensor",
     "megatron/core/optimizer/distrib_optimizer.py:_build_model_and_main_param_groups"),
    ("cpu_rng_tracker", "rng", None, NO_CUDA,
     "megatron/core/tensor_parallel/random.py:add"),
    ("cpu_streams", "streams", None, NO_CUDA,
     "megatron/core/pipeline_parallel/utils.py:set_streams"),
]
# Shims whose scenarios never touch each other's targets share one subprocess (megatron's
# import dominates the cost): the rng scenario needs no stream, the streams one no RNG.
_SHARED_RUN = {"cpu_rng_tracker": ("cpu_rng_tracker", "cpu_streams"),
               "cpu_streams": ("cpu_rng_tracker", "cpu_streams")}


@functools.lru_cache(maxsize=None)
def _report_without(skip: tuple) -> dict:
    scenarios = sorted({f[1] for f in FAILURES_WITHOUT if f[0] in skip})
    return run_scenarios(*scenarios, skip=skip)


@pytest.mark.parametrize(
    "shim,scenario,error_type,text,raised_in", FAILURES_WITHOUT,
    ids=[f"{f[0]}-{f[1]}" for f in FAILURES_WITHOUT],
)
def test_each_shim_prevents_a_real_megatron_failure(shim, scenario, error_type, text, raised_in):
    report = _report_without(_SHARED_RUN.get(shim, (shim,)))
    assert shim not in report["applied"]
    r = report[scenario]
    if text == NO_CUDA:
        assert (r.get("error_type"), r.get("error", "").splitlines()[0]) in torch_no_cuda_errors(), r
    else:
        assert r.get("error_type") == error_type, r
        assert text in r["error"]
    assert r["raised_in"] == raised_in


def test_import_has_no_side_effects_and_apply_cpu_is_idempotent_and_rewrites_devices():
    r = run_python(
        """
        import json, torch
        from torch.overrides import _get_current_function_mode_stack as stack
        original = torch.cuda.current_device
        from megatron_biglm import patches
        out = {"patched_on_import": torch.cuda.current_device is not original or len(stack()) > 0}
        first = patches.apply_cpu(); second = patches.apply_cpu()
        out.update(first=first, same_on_second=first == second, modes=len(stack()))
        x = torch.arange(4.0)
        out["zeros_cuda"] = str(torch.zeros(2, device="cuda").device)
        out["zeros_cuda1"] = str(torch.zeros(2, device=torch.device("cuda", 1)).device)
        out["empty_int"] = str(torch.empty(2, device=0).device)
        out["current_device"] = str(torch.tensor([1], device=torch.cuda.current_device()).device)
        out["cuda_is_self"] = x.cuda() is x and x.cuda(0, non_blocking=True) is x
        y = x.to("cuda:0", torch.float64)
        out["to_cuda_dtype"] = [str(y.device), str(y.dtype), y.tolist()]
        out["to_kw"] = str(x.to(device=torch.device("cuda")).device)
        out["to_dtype_only"] = str(x.to(torch.float16).dtype)
        out["pinned"] = torch.tensor([1.0], pin_memory=True).tolist()
        out["pin_is_self"] = x.pin_memory() is x
        out["type"] = [x.type(), x.long().type(), x.half().type()]
        out["type_convert"] = [str(x.type("torch.cuda.HalfTensor").dtype),
                               str(x.type(torch.float64).dtype)]
        out["synchronize"] = torch.cuda.synchronize() is None
        print(json.dumps(out))
        """
    )
    assert r["patched_on_import"] is False
    assert r["first"] == [
        "cpu_current_device", "cpu_synchronize", "cpu_streams", "cpu_device_mode",
        "cpu_tensor_type", "cpu_rng_tracker",
    ]
    assert r["same_on_second"] and r["modes"] == 1  # a second call enters no second mode
    assert r["zeros_cuda"] == r["zeros_cuda1"] == r["empty_int"] == r["current_device"] == "cpu"
    assert r["cuda_is_self"] and r["pin_is_self"]
    assert r["to_cuda_dtype"] == ["cpu", "torch.float64", [0.0, 1.0, 2.0, 3.0]]
    assert r["to_kw"] == "cpu" and r["to_dtype_only"] == "torch.float16"
    assert r["pinned"] == [1.0]
    assert r["type"] == ["torch.cuda.FloatTensor", "torch.cuda.LongTensor", "torch.cuda.HalfTensor"]
    assert r["type_convert"] == ["torch.float16", "torch.float64"]
    assert r["synchronize"]


def test_apply_cpu_is_a_no_op_when_cuda_is_available(monkeypatch):
    """In-process: with CUDA "available" nothing may change (other test modules may have
    applied the shims in this process already, so compare before/after)."""
    from megatron_biglm import patches
    from torch.overrides import _get_current_function_mode_stack

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a GPU node
    before = (torch.cuda.current_device, torch.cuda.synchronize, torch.cuda.current_stream,
              len(_get_current_function_mode_stack()), patches.applied_cpu_patches())
    assert patches.apply_cpu() == []
    after = (torch.cuda.current_device, torch.cuda.synchronize, torch.cuda.current_stream,
             len(_get_current_function_mode_stack()), patches.applied_cpu_patches())
    assert after == before


def test_missing_patch_target_is_logged_as_not_needed_not_a_crash():
    r = run_python(
        """
        import json, logging, sys
        messages = []
        handler = logging.Handler(); handler.emit = lambda rec: messages.append(rec.getMessage())
        logging.getLogger("megatron_biglm.patches").addHandler(handler)
        logging.getLogger("megatron_biglm.patches").setLevel(logging.INFO)
        sys.modules["megatron.core.tensor_parallel.random"] = None  # as if a release dropped it
        from megatron_biglm import patches
        print(json.dumps({"applied": patches.apply_cpu(force=True), "log": messages}))
        """
    )
    assert "cpu_rng_tracker" not in r["applied"]
    assert "cpu_device_mode" in r["applied"]
    assert any(
        "megatron.core.tensor_parallel.random missing" in m and "not needed" in m for m in r["log"]
    ), r["log"]


def test_replace_attr_reports_missing_attribute(caplog):
    from megatron_biglm.patches._patching import replace_attr

    owner = types.SimpleNamespace(present=lambda: 1)
    with caplog.at_level(logging.INFO, logger="megatron_biglm.patches"):
        assert replace_attr(owner, "absent", lambda orig: orig, "demo") is False
    assert "not found in this version: not needed" in caplog.text
    assert replace_attr(owner, "present", lambda orig: (lambda: 2), "demo") is True
    replaced = owner.present
    assert replace_attr(owner, "present", lambda orig: (lambda: 3), "demo") is True
    assert owner.present is replaced and owner.present() == 2  # applied once


def test_unknown_skip_name_is_a_clear_error():
    from megatron_biglm import patches

    with pytest.raises(ValueError, match="unknown CPU patch names"):
        patches.apply_cpu(skip=["cpu_typo"])
