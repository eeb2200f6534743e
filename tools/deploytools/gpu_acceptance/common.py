"""GPU acceptance: constants, the target image, the launch plan as the runner reads it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
TOOLS = REPO / "tools"
GATE_CLI = TOOLS / "health-gate"
# The repository's collection: tools/health-gate imports the gate's package from it by its one
# name (docs/architecture.md); the GPU host's python3 has no venv, so it goes on PYTHONPATH.
COLLECTIONS = REPO / "collections"


# --------------------------------------------------------------------------------------
# The target: a GPU host whose python3 is a CUDA 13 PyTorch image (the one the committed
# run used, bench/results/gpu_acceptance.md). A host without these packages needs them
# installed first, or a bundle built with a shorter IMAGE_PROVIDED.
# --------------------------------------------------------------------------------------
TARGET_PYTHON = "3.12"
TARGET_PLATFORM = "manylinux_2_34_x86_64"
DEFAULT_LOCK = REPO / "roles" / "ml_env" / "files" / "locks" / "sglang-0.5.11.txt"
# Python packages the target image provides: used as they are, never carried.
IMAGE_PROVIDED = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt
jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba
numba-cuda numpy numpyro nvidia-* onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax
opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy
portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core
scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham
simplejson six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore
threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric
torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3
uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split()
# In the lock but not needed to serve a bf16 model on Hopper (the committed run served without them).
NOT_NEEDED = """
flashinfer-cubin flash-attn-4 quack-kernels llguidance outlines modelscope kernels mistral-common
anthropic blobfile torchcodec smg-grpc-servicer py-spy cuda-python
""".split()
# Pulled in by SGLang 0.5.17 (not in 0.5.11's lock) and never imported while it starts and serves
# Qwen3.6-27B on an H200 (shared/facts/sglang-versions.md; bench/results/realsize-0.5.17.md): left
# out as above, with what only they need (nvidia-mathdx is IMAGE_PROVIDED's nvidia-*).
NOT_NEEDED += "helion humming-kernels tilelang tokenspeed-mla zstandard nccl4py".split()
# Carried although the image has another version, or although no declared dependency
# leads to them: sglang pins transformers 5.6.0 (needs tokenizers <= 0.23.0) and imports
# dill and jsonschema without declaring them; tvm-ffi uses torch-c-dlpack-ext.
KEEP = """
transformers tokenizers dill jsonschema jsonschema-specifications referencing rpds-py torch-c-dlpack-ext
""".split()
# Deleted from the site tree before packing, whatever the GPU: FlashMLA (MLA models only),
# static libraries and the CUDA 12 hook of torch_memory_saver (the image is CUDA 13).
STRIP = [
    "sgl_kernel/flashmla_ops.abi3.so",
    "lib/*.a",
    "torch_memory_saver_hook_mode_torch_cu12.abi3.so",
]
# sgl_kernel loads its build under sgl_kernel/sm90/ on compute capability 9.0 and the one under
# sgl_kernel/sm100/ on every other GPU, sm86 (the RTX A6000) included (sgl_kernel/load_utils.py,
# _load_architecture_specific_ops): only a bundle for sm90 GPUs alone may leave sm100/ out.
STRIP_SM90_ONLY = ["sgl_kernel/sm100"]
# Compute capability (major * 10 + minor) by a word of the GPU's name as nvidia-smi reports it
# (the inventory's offline_plan.gpus[].name, e.g. "NVIDIA RTX A6000", "NVIDIA H200").
GPU_COMPUTE_CAPABILITY = {
    "A100": 80, "A800": 80, "A6000": 86, "A40": 86, "A10": 86, "L40S": 89, "L40": 89, "L4": 89, "4090": 89,
    "H100": 90, "H200": 90, "H800": 90, "H20": 90, "GH200": 90, "B200": 100, "GB200": 100,
}  # fmt: skip


def compute_capability(gpu_name: str) -> int | None:
    """The compute capability of a GPU by its name, or None when the name is not known."""
    for word in gpu_name.replace("-", " ").split():
        if word.upper() in GPU_COMPUTE_CAPABILITY:
            return GPU_COMPUTE_CAPABILITY[word.upper()]
    return None


def strips_for(gpu_names: list[str]) -> list[str]:
    """What the bundle leaves out for these GPUs: the sm100 kernels only when every GPU is sm90
    (an unknown or missing name keeps them: a bundle too large works, one too small does not)."""
    capabilities = {compute_capability(name) for name in gpu_names}
    return STRIP + (STRIP_SM90_ONLY if capabilities == {90} else [])


# The acceptance host: 2x H200 and the one tiny-model allowance (docs/gpu.md: the
# draft's KV pool) live in this inventory, read by tools/launch-plan like any other host.
ACCEPTANCE_INVENTORY = REPO / "inventory" / "gpu-acceptance.yml"
ACCEPTANCE_HOST = "h200-acceptance"
# Forced on every process started on the GPU host: NVLink multicast off, which is safe on
# any host and needed where the GPUs are shared or partitioned.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# Added where the plan does not set them: the bundle carries everything, so the GPU host
# needs (and is given) no network.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
# Removed from the inherited environment: they would leak the driver's Python setup.
DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")
# The seed's by-hand launch (origin story), with the model path and interpreter filled in.
ORIGINAL_FLAGS = [
    "--speculative-algorithm",
    "NEXTN",
    "--speculative-num-draft-tokens",
    "1",
    "--tensor-parallel-size",
    "2",
    "--port",
    "30000",
    "--host",
    "0.0.0.0",
    "--trust-remote-code",
    "--dtype",
    "bfloat16",
]
EXPECTED_REFUSAL = "not compatible with radix cache"
DEFAULT_STATE = Path(os.environ.get("GPUW_STATE", "/root/gpuw"))
MODEL_ARCHIVE = "model.tar.gz"
MANIFEST = "acceptance.json"
# Where JIT compilers put their caches when nothing redirects them (root's home).
DEFAULT_JIT_DIRS = [
    "~/.cache/flashinfer",
    "~/.triton/cache",
    "~/.cache/tvm-ffi",
    "~/.nv/ComputeCache",
    "/tmp/torchinductor_root",
    "~/.cache/sglang",
    "~/.cache/deep_gemm",
]
LOG_MARKERS = re.compile(
    r"fired up|Capture cuda graph|Load weight|max_total_num_tokens|KV Cache|mamba|"
    r"FlashInfer|AllReduce|speculative|accept|Traceback|Error|Exception|version|"
    r"memory pool|max_running_requests|attention backend|Using .* backend",
    re.IGNORECASE,
)
SECRET_KEYS = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
BUILTIN_PROMPTS = [
    "Write a Python function that parses a log file and returns the ten most frequent errors.",
    "Explain the difference between a process and a thread, with an example in Go.",
    "Write a SQL query that returns the ten most requested endpoints of the last day.",
    "Refactor this class so that the configuration is loaded once:\nclass Config:\n    def __init__(self, path):\n"
    "        self.data = json.loads(Path(path).read_text())\n",
]


class AcceptanceError(Exception):
    """A step failed; the message is one sentence for the step's output."""


# The figures of a run that gpu_acceptance.md tables and collect prints.
HEADLINE_KEYS = (
    "launched ready_s gate_passed gate_tps eval_score accept_length sglang_version tp_size speculative_algorithm "
    "mamba_scheduler_strategy bench_serving_tps tps_ratio cold_ready_s warm_ready_s"
).split()
# The run on the GPU host after the folders are received (``run`` and run.md): fail fast,
# install, the seed's flags, a cold start measured by the gate and bench_serving, a warm
# restart measured by the gate.
RUN_STEPS = [
    "check",
    "install",
    "original-flags",
    "launch cold",
    "wait cold --timeout 570",
    "gate cold",
    "bench-serving cold",
    "restart cold warm --timeout 240",
    "gate warm",
]


def nvidia_smi(query: str, fmt: str = "csv,noheader") -> str:
    """``nvidia-smi --query-gpu=QUERY --format=FMT``'s output ('' without nvidia-smi or on a timeout)."""
    try:
        return subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", f"--format={fmt}"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def say(message: str) -> None:
    """Print one progress line at once (a remote session may show only the output's tail)."""
    print(f"[gpu-acceptance {time.strftime('%H:%M:%S')}] {message}", flush=True)


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (a kill mid-write leaves the old file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def masked(env: dict[str, str]) -> dict[str, str]:
    """The environment with secret-looking values hidden."""
    return {k: ("***" if SECRET_KEYS.search(k) else v) for k, v in env.items()}


# --------------------------------------------------------------------------------------
# The launch plan ({"argv": [...], "env": {...}, "notes": [...]}), read, never built here.
# --------------------------------------------------------------------------------------


def flag_value(argv: list[str], flag: str) -> str | None:
    """Value of ``--flag value`` or ``--flag=value`` in argv (last one wins), else None."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


@dataclass(frozen=True)
class Plan:
    """A validated launch plan and what the driver reads from it."""

    argv: list[str]
    env: dict[str, str]
    notes: list[str]

    @classmethod
    def from_dict(cls, data: Any) -> Plan:
        """Check the plan's shape; raise with one sentence if it is not a usable SGLang plan."""
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("argv"), list)
            or not isinstance(data.get("env", {}), dict)
        ):
            raise AcceptanceError("the plan must be a JSON object with 'argv' (list) and 'env' (object)")
        argv = [str(a) for a in data["argv"]]
        env = {str(k): str(v) for k, v in data.get("env", {}).items()}
        if len(argv) < 2 or not argv[0].endswith("/bin/sglang") or argv[1] != "serve":
            raise AcceptanceError(f"the plan's argv must start with '<venv>/bin/sglang serve', not {argv[:2]}")
        if not flag_value(argv, "--model-path"):
            raise AcceptanceError("the plan's argv has no --model-path")
        return cls(argv, env, [str(n) for n in data.get("notes", [])])

    @classmethod
    def from_file(cls, path: Path) -> Plan:
        """A rendered plan JSON file (tools/launch-plan's plan: argv, env, notes)."""
        return cls.from_dict(json.loads(Path(path).read_text()))

    @property
    def venv_dir(self) -> Path:
        """The venv the plan runs from (argv[0] is ``<venv>/bin/sglang``)."""
        return Path(self.argv[0]).parent.parent

    @property
    def model_path(self) -> Path:
        """The plan's ``--model-path``."""
        return Path(flag_value(self.argv, "--model-path") or "")

    @property
    def port(self) -> int:
        """The plan's ``--port`` (SGLang's default 30000)."""
        return int(flag_value(self.argv, "--port") or 30000)

    @property
    def url(self) -> str:
        """Where a client on the same machine reaches the server."""
        host = flag_value(self.argv, "--host") or "127.0.0.1"
        host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        return f"http://{host}:{self.port}"

    def as_dict(self) -> dict[str, Any]:
        """The plan as JSON data."""
        return {"argv": self.argv, "env": self.env, "notes": self.notes}
