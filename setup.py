"""megatron-biglm: train, evaluate and export BiGLM (Bidirectional General Language Models).

CPU machines must install torch first from the pin in constraints-cpu.txt (the Makefile does);
otherwise pip resolves `torch` to the newest CUDA build.
"""
from setuptools import find_packages, setup

setup(
    name="megatron-biglm",
    version="0.1.0",
    description="BiGLM pretraining, evaluation and export on megatron-core",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["megatron_biglm", "megatron_biglm.*"]),
    include_package_data=True,
    install_requires=[
        # Tested: 0.16.1 (Python 3.11) and 0.19.2 (Python 3.12); see common/mcore_internals.py.
        "megatron-core>=0.16.1,<0.20",
        "torch>=2.6",
        "numpy",
        "transformers>=5.3",  # native EuroBertForMaskedLM (our HF export target) landed in 5.3
        "tokenizers",
        "datasets",
        "safetensors",
        "tqdm",
        "psutil",
        "pyyaml",
        "zstandard",
        "pyarrow",
    ],
    extras_require={
        # apex is not on PyPI; see README "Optional: apex" for the source build.
        "gpu": ["flash-attn", "transformer-engine[pytorch]"],
        "deepspeed": ["deepspeed>=0.19"],  # tested: 0.19.8; CPU installs: DS_BUILD_OPS=0 (no op builds)
        "eval": ["lm-eval>=0.4.5", "rouge-score", "sacrebleu", "nltk"],
        # retrieval: the sentence-transformers export and BEIR metrics (trec_eval through pytrec_eval)
        "retrieval": ["sentence-transformers>=5", "pytrec-eval-terrier>=0.5.6"],
        # benchmarks/bench_finetune.py: transformers' Trainer needs accelerate
        "bench": ["accelerate>=1.1.0"],
        # biglm-serve; its tests drive it with the openai client and lm-eval's API model
        "serve": ["fastapi>=0.110", "uvicorn>=0.29", "openai>=1.0", "lm-eval[api]>=0.4.5"],
        "dev": ["pytest", "pytest-timeout", "pytest-xdist", "hypothesis", "scipy", "matplotlib", "tensorboard"],
    },
    # The naming rule: `python -m megatron_biglm.cli.NAME` is the console script `biglm-NAME`,
    # underscores as hyphens (tests/test_architecture.py checks it).
    entry_points={
        "console_scripts": [
            "biglm-quickstart=megatron_biglm.cli.quickstart:main",
            "biglm-train=megatron_biglm.cli.train:main",
            "biglm-finetune=megatron_biglm.cli.finetune:main",
            "biglm-instruct-tune=megatron_biglm.cli.instruct_tune:main",
            "biglm-instruct-data=megatron_biglm.cli.instruct_data:main",
            "biglm-lowdata=megatron_biglm.cli.lowdata:main",
            "biglm-generate=megatron_biglm.cli.generate:main",
            "biglm-eval-zero-shot=megatron_biglm.cli.eval_zero_shot:main",
            "biglm-eval-multitask=megatron_biglm.cli.eval_multitask:main",
            "biglm-eval-retrieval=megatron_biglm.cli.eval_retrieval:main",
            "biglm-convert=megatron_biglm.cli.convert:main",
            "biglm-preprocess=megatron_biglm.cli.preprocess:main",
            "biglm-preprocess-shards=megatron_biglm.cli.preprocess_shards:main",
            "biglm-merge-datasets=megatron_biglm.cli.merge_datasets:main",
            "biglm-inspect-dataset=megatron_biglm.cli.inspect_dataset:main",
            "biglm-train-tokenizer=megatron_biglm.cli.train_tokenizer:main",
            "biglm-count-params=megatron_biglm.cli.count_params:main",
            "biglm-kernels=megatron_biglm.cli.kernels:main",
            "biglm-plan=megatron_biglm.cli.plan:main",
            "biglm-plot-curves=megatron_biglm.cli.plot_curves:main",
            "biglm-fetch-data=megatron_biglm.cli.fetch_data:main",
            "biglm-lm-eval=megatron_biglm.cli.lm_eval:main",
            "biglm-serve=megatron_biglm.cli.serve:main",
            # aliases (users' scripts may name them); cli/__init__.py lists them
            "biglm-eval=megatron_biglm.cli.eval_zero_shot:main",
            "biglm-export=megatron_biglm.cli.convert:main",
        ]
    },
)
