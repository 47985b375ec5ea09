"""The wheels the prepared device run carries (benchmarks/device_wheels.txt), and their checks.

The lent device has Python 3.12, torch 2.11 and the packages of its image (IMAGE below), no
megatron-core, and no internet: what the run imports beyond the image travels as wheels in
`.whl/` (with the tree, at most 64 MiB a call), each pinned by version.

    python benchmarks/device_wheels.py download [--dest .whl]   # here, once, with internet
    python benchmarks/device_wheels.py check [--dest .whl]      # every pin there once; every
                                                                # requirement met by a wheel or the image
    python benchmarks/device_wheels.py imports [--site DIR] [--image-only]
                                      # import what the run imports (with --image-only: refuse any
                                      # package that is neither in DIR nor on the device image)
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PINS = Path(__file__).with_name("device_wheels.txt")
MAX_MIB = 40  # the wheels' share of the 64 MiB a call carries (the tree and the JSON need the rest)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
# The device image's Python packages (as its documentation lists them): not carried.
IMAGE = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy
peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel
wrapt xarray xxhash yarl zipp
""".split())
# What the run imports beyond the standard library: the benchmark's sections (those they start
# as subprocesses too: cli.train's pieces, biglm-serve) and the `-m gpu` tests it runs.
RUN_IMPORTS = (
    "megatron.core", "megatron_biglm.run.train", "megatron_biglm.cli.serve", "megatron_biglm.serving.app",
    "benchmarks.bench_gpu", "benchmarks.gpu_train", "benchmarks.bench_attention", "benchmarks.bench_longform",
    "benchmarks.bench_eval", "benchmarks.bench_generation", "benchmarks.bench_serve",
    "lm_eval", "lm_eval.api.instance", "lm_eval.api.model", "fastapi", "uvicorn", "zstandard",
)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path = PINS) -> dict:
    """{canonical name: version} from `name==version` lines (`#` starts a comment; a `!name`
    line is a requirement left out on purpose: see `left_out`)."""
    pins = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("!"):
            continue
        name, sep, version = line.partition("==")
        if not sep or not version.strip():
            raise ValueError(f"{path}:{n}: {line!r} is not pinned: write NAME==VERSION")
        pins[canonical(name.strip())] = version.strip()
    return pins


def left_out(path: Path = PINS) -> set:
    """Requirements of carried wheels that the run never imports (`!name` lines): not carried."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return {canonical(line[1:].strip()) for line in lines if line.startswith("!")}


def download(dest: Path) -> int:
    pins = read_pins()
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", *[a for p in PLATFORMS for a in ("--platform", p)], "-d", str(dest),
           *[f"{n}=={v}" for n, v in pins.items()]]
    return subprocess.run(cmd).returncode


def _wheel_meta(path: Path) -> tuple[str, str, list]:
    """(canonical name, version, Requires-Dist lines) of a wheel."""
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode("utf-8")
    fields = {}
    requires = []
    for line in text.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(": ")
        if key == "Requires-Dist":
            requires.append(value)
        else:
            fields.setdefault(key, value)
    return canonical(fields["Name"]), fields["Version"], requires


def check(dest: Path) -> list[str]:
    """What keeps `dest` from installing and importing offline on the device: a pin missing or
    at another version, a wheel not pinned, a requirement (for Python 3.12 on Linux, extras
    not asked for) met neither by a carried wheel nor by the image nor left out on purpose, or
    too many MiB."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    env = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3",
           "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "extra": ""}
    pins, skipped = read_pins(), left_out()
    wheels = sorted(dest.glob("*.whl"))
    found = {}
    problems = []
    for w in wheels:
        name, version, requires = _wheel_meta(w)
        if name in found:
            problems.append(f"{w.name}: a second wheel of {name} (pip stops at two versions)")
        found[name] = (version, requires)
    for name, version in pins.items():
        if name not in found:
            problems.append(f"{name}=={version}: no wheel in {dest} (run: python benchmarks/device_wheels.py download)")
        elif found[name][0] != version:
            problems.append(f"{name}: wheel {found[name][0]}, pinned {version}")
    for name, (version, requires) in found.items():
        if name not in pins:
            problems.append(f"{name} {version}: carried but not pinned in {PINS.name}")
        for text in requires:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            dep = canonical(req.name)
            if dep in found:
                if not req.specifier.contains(found[dep][0], prereleases=True):
                    problems.append(f"{name} needs {text}; carried {dep} {found[dep][0]}")
            elif dep not in IMAGE and dep not in skipped:
                problems.append(f"{name} needs {text}: neither carried nor on the device image")
    mib = sum(w.stat().st_size for w in wheels) / 2**20
    if mib > MAX_MIB:
        problems.append(f"{dest}: {mib:.1f} MiB of wheels, more than {MAX_MIB} MiB")
    return problems


def image_view(folder: Path) -> Path:
    """A folder of links to this interpreter's installed packages that the device image has
    (their modules and metadata), and nothing else: with `python -S` and PYTHONPATH set to the
    carried site, this view and the repository, an import sees what the device would see."""
    from importlib.metadata import distributions

    folder.mkdir(parents=True, exist_ok=True)
    for dist in distributions():
        if canonical(dist.metadata["Name"] or "") not in IMAGE or dist.files is None:
            continue
        base = Path(dist.locate_file(""))
        tops = {f.parts[0] for f in dist.files if f.parts and not f.parts[0].startswith("..")}
        for top in tops:
            link, target = folder / top, base / top
            if target.exists() and not link.exists() and top not in ("__pycache__", "bin"):
                link.symlink_to(target)
    return folder


def imports(site: Path | None, image_only: bool) -> list[str]:
    """Import every module of RUN_IMPORTS; the failures, each with its error. `image_only`:
    in a child `python -S` that sees only the standard library, `site`, the device image's
    packages (image_view) and the repository."""
    if image_only:
        import os
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            view = image_view(Path(tmp) / "image")
            path = os.pathsep.join(str(p) for p in (site, view, ROOT) if p is not None)
            proc = subprocess.run([sys.executable, "-S", str(Path(__file__).resolve()), "imports"],
                                  env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True)
        return [line[len("error: "):] for line in proc.stderr.splitlines() if line.startswith("error: ")] or (
            [] if proc.returncode == 0 else [f"the import check exited {proc.returncode}: {proc.stderr[-2000:]}"])
    if site is not None:
        sys.path.insert(0, str(site))
    failed = []
    for name in RUN_IMPORTS:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - each failure is reported, then the next is tried
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
    return failed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("download", "check", "imports"))
    p.add_argument("--dest", type=Path, default=ROOT / ".whl")
    p.add_argument("--site", type=Path, default=None, help="imports: the folder the wheels were installed to")
    p.add_argument("--image-only", action="store_true",
                   help="imports: see only the standard library, --site, the device image's packages and this tree")
    args = p.parse_args(argv)
    if args.command == "download":
        return download(args.dest)
    problems = check(args.dest) if args.command == "check" else imports(args.site, args.image_only)
    for line in problems:
        print(f"error: {line}", file=sys.stderr)
    print(f"{args.command}: {'ok' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
