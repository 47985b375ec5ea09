"""The prepared device run on CPU: `bash benchmarks/device_run.sh --dry-run` with a section
made to raise and one made to overrun still exits 0 with every other section's figures; a
missing serve extra skips serve by name; the carried wheels install offline and import."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import device_wheels, gpu_sections
from benchmarks.gpu_report import GOALS, MD_NAME
from benchmarks.gpu_results import JSON_NAME

ROOT = Path(__file__).resolve().parents[2]
HEADLINES = ("train_step_mfu", "train_loop_vs_bare", "split_vs_plain", "longform_cached_vs_canvas",
             "longform_identical", "eval_cache_speedup", "serve_concurrent_vs_sequential")
# An import blocker for a child interpreter: `uvicorn` (of the serve extra) is not installed.
BLOCK_UVICORN = '''import sys
class _NoUvicorn:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "uvicorn":
            raise ModuleNotFoundError("No module named 'uvicorn'", name="uvicorn")
        return None
sys.meta_path.insert(0, _NoUvicorn())
'''


def _numbers(obj):
    if isinstance(obj, dict):
        return [n for v in obj.values() for n in _numbers(v)]
    if isinstance(obj, list):
        return [n for v in obj for n in _numbers(v)]
    return [obj] if isinstance(obj, (int, float)) and not isinstance(obj, bool) else []


def _device_run(tmp_path, *flags, env=None):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, **(env or {})}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "device_run.sh"), "--dry-run", *flags],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    results = json.loads((tmp_path / "gpu" / JSON_NAME).read_text())
    return proc, results


@pytest.mark.slow
def test_device_run_dry_run_keeps_every_other_section_through_a_raise_and_an_overrun(tmp_path):
    proc, results = _device_run(tmp_path, "--inject-failure", "attention", "--inject-failure", "generation:hang",
                                "--budget-s", "generation=3")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sections = results["sections"]
    assert list(sections) == list(gpu_sections.DEFAULT)  # all ran, in the order a user pays for
    assert sections["attention"]["status"] == "error" and "injected failure" in sections["attention"]["error"]
    assert sections["generation"]["status"] == "overrun" and "budget of 3 s" in sections["generation"]["error"]
    assert 3 <= sections["generation"]["elapsed_s"] < 10
    for name, record in sections.items():
        assert {"recompiles", "graph_breaks", "elapsed_s", "budget_s"} <= set(record), name
        assert record["status"] in ("ok", "error", "overrun"), (name, record.get("error"))
    for key in set(HEADLINES) - {"split_vs_plain"}:
        assert key in results, key
    assert "split_vs_plain" not in results and "mask_predict_vs_ar" not in results
    assert results["longform_identical"] is True
    for name in ("train", "mfu", "longform", "eval", "serve"):
        numbers = _numbers(results[name])
        assert sections[name]["status"] == "ok" and numbers and all(math.isfinite(n) for n in numbers), name

    train = results["train"]  # the loop against its twin, both through megatron's optimizer
    for side in ("loop", "bare"):
        assert train[side]["steps_timed"] == len(train[side]["step_times_s"]) >= 3
        assert train[side]["recompiles"] == 0
    assert results["train_loop_vs_bare"] == train["bare"]["step_s"] / train["loop"]["step_s"]
    assert train["num_micro"] == 2 and "train_step" in train["bare"]["runs"]
    assert 0.2 < train["bare"]["predicted_fraction"] < 0.6  # the objective's own mask density
    assert set(train["loop"]["phases_s"]) >= {"loop's own"}
    assert results["train_step_mfu"] == results["mfu"]["loop"]["mfu"] > 0
    assert results["eval_cache_speedup"] == min(r["speedup"] for r in results["eval"]["rules"].values())
    assert results["serve"]["same_outputs"] is True
    assert [g["key"] for g in results["goals"]] == [k for k in GOALS if k in results]

    table = (tmp_path / "gpu" / MD_NAME).read_text()
    assert "| attention | status" in table and "injected failure" in table and "overrun" in table
    assert "not measured" in table  # split / plain: its section raised
    assert "device_run: benchmark exit 0" in proc.stdout


@pytest.mark.slow
def test_dry_run_without_the_serve_extra_skips_serve_by_name(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCK_UVICORN)
    env = {"PYTHONPATH": os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")])}
    proc, results = _device_run(tmp_path, "--sections", "attention", "serve", env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert results["sections"]["serve"]["status"] == "skipped"
    assert results["sections"]["serve"]["error"] == "skipped: uvicorn not installed"
    assert results["sections"]["attention"]["status"] == "ok" and "split_vs_plain" in results
    assert "skipped: uvicorn not installed" in (tmp_path / "gpu" / MD_NAME).read_text()


def _wheel_folder() -> Path:
    return Path(os.environ.get("BIGLM_DEVICE_WHEELS", ROOT / ".whl"))


@pytest.mark.slow
def test_offline_wheels_install_without_an_index_and_import_what_the_run_imports(tmp_path):
    """What device_run.sh does on the device: install the carried wheels with --no-index and
    --no-deps into a fresh folder, then import everything the run imports, seeing only the
    standard library, that folder, the device image's packages and this tree."""
    if sys.version_info[:2] != (3, 12):
        pytest.skip(f"the device runs Python 3.12 and its wheels are built for it; this is {sys.version.split()[0]}")
    folder = _wheel_folder()
    if not any(folder.glob("*.whl")):
        pytest.skip(f"no wheels in {folder}: python benchmarks/device_wheels.py download (make test does on stack b)")
    assert device_wheels.check(folder) == []
    site = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                              "--no-cache-dir", "--target", str(site), *map(str, sorted(folder.glob("*.whl")))],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-3000:]
    assert device_wheels.imports(site, image_only=True) == []


def test_wheel_pins_are_exact_and_carry_nothing_the_run_does_not_import():
    pins = device_wheels.read_pins()
    assert "megatron-core" in pins and "liger-kernel" not in pins
    assert not set(pins) & device_wheels.IMAGE  # the image has it: carrying it would shadow the device's
    assert not set(pins) & device_wheels.left_out()


def test_an_unpinned_wheel_line_is_refused_with_its_line(tmp_path):
    bad = tmp_path / "pins.txt"
    bad.write_text("# comment\nmegatron-core==0.19.2\nlm-eval\n")
    with pytest.raises(ValueError, match=r"pins.txt:3: 'lm-eval' is not pinned"):
        device_wheels.read_pins(bad)

