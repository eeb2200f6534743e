"""Tests of the GPU acceptance tools (CPU only): tools/build-bundle, tools/lock-profile,
tools/gpu-acceptance (deploytools.build_bundle, deploytools.lock_profile,
deploytools.gpu_acceptance) and the acceptance mode of tools/make-tiny-model."""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import deploytools.gpu_acceptance.cli  # noqa: F401  (imports every module of the package)
import fake_sglang_lm
import pytest
from deploytools import build_bundle, lock_profile
from deploytools import gpu_acceptance as ga

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "roles" / "ml_env" / "files" / "locks" / "sglang-0.5.11.txt"


bb = build_bundle
lp = lock_profile

SAMPLE_LOCK = """\
# title: sample
# requirements: app==1.0
# python: 3.10 3.12
app==1.0  # requested
big-core==2.0  # via app
nvidia-cublas==13.1  # via big-core
nvidia_nccl==2.28  # via big-core, nvidia-cublas
helper==0.1 ; python_version < "3.11"  # via app
helper==0.2 ; python_version >= "3.11"  # via app
shared==3.0  # via app, big-core
"""


# --------------------------------------------------------------------------------------
# build-bundle: lock parsing and selection
# --------------------------------------------------------------------------------------


def test_parse_lock_reads_pins_markers_and_via() -> None:
    entries = bb.parse_lock_text(SAMPLE_LOCK)
    assert [e.pin for e in entries][:3] == ["app==1.0", "big-core==2.0", "nvidia-cublas==13.1"]
    helper = [e for e in entries if e.key == "helper"]
    assert [h.marker for h in helper] == ['python_version < "3.11"', 'python_version >= "3.11"']
    assert entries[0].via == ()  # requested: never pruned
    assert next(e for e in entries if e.name == "nvidia_nccl").via == ("big-core", "nvidia-cublas")
    assert bb.lock_header(SAMPLE_LOCK)["requirements"] == "app==1.0"


def test_parse_lock_refuses_unpinned_lines() -> None:
    with pytest.raises(bb.BundleError, match="not pinned with =="):
        bb.parse_lock_text("app>=1.0\n", "x.txt")


def test_markers_are_evaluated_for_the_target_python() -> None:
    entries = bb.parse_lock_text(SAMPLE_LOCK)
    assert {e.key: e.version for e in bb.entries_for_target(entries, "3.10")}["helper"] == "0.1"
    assert {e.key: e.version for e in bb.entries_for_target(entries, "3.12")}["helper"] == "0.2"
    with pytest.raises(bb.BundleError, match="pinned twice"):
        bb.entries_for_target(bb.parse_lock_text("a==1\na==2\n"), "3.12")


def test_exclude_prunes_orphans_and_keep_wins() -> None:
    entries = bb.entries_for_target(bb.parse_lock_text(SAMPLE_LOCK), "3.12")
    chosen, dropped = bb.select(entries, exclude=["big_core"])
    assert {e.key for e in chosen} == {"app", "helper", "shared"}
    assert dropped["big-core"] == "excluded"
    assert dropped["nvidia-nccl"].startswith("only needed by")
    chosen, _ = bb.select(entries, exclude=["big-core"], keep=["nvidia-cublas"])
    assert {e.key for e in chosen} == {"app", "helper", "shared", "nvidia-cublas", "nvidia-nccl"}
    chosen, _ = bb.select(entries, exclude=["nvidia-*"])
    assert {e.key for e in chosen} == {"app", "big-core", "helper", "shared"}
    chosen, _ = bb.select(entries, exclude=["big-core"], prune=False)
    assert "nvidia-cublas" in {e.key for e in chosen}


def test_only_selects_exactly_and_rejects_unknown_names() -> None:
    entries = bb.entries_for_target(bb.parse_lock_text(SAMPLE_LOCK), "3.12")
    chosen, _ = bb.select(entries, only=["app", "nvidia-*"])
    assert {e.key for e in chosen} == {"app", "nvidia-cublas", "nvidia-nccl"}
    with pytest.raises(bb.BundleError, match="not in the lock"):
        bb.select(entries, only=["nope"])


def test_platform_expansion_and_sizes() -> None:
    tags = bb.expand_platforms(["manylinux_2_34_x86_64"])
    assert tags[0] == "manylinux_2_34_x86_64" and "manylinux_2_17_x86_64" in tags
    assert {"manylinux2014_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert bb.parse_size("56M") == 56 * 2**20 and bb.parse_size("4096") == 4096
    with pytest.raises(bb.BundleError):
        bb.parse_size("lots")


def test_list_mode_prints_the_selection(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lock = tmp_path / "lock.txt"
    lock.write_text(SAMPLE_LOCK)
    assert (
        bb.main(
            [
                "--lock",
                str(lock),
                "--out",
                str(tmp_path / "w"),
                "--python-version",
                "3.10",
                "--exclude",
                "big-core",
                "--list",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.split() == ["app==1.0", "helper==0.1", "shared==3.0"]
    assert not (tmp_path / "w").exists()


# --------------------------------------------------------------------------------------
# build-bundle: split, join, pack
# --------------------------------------------------------------------------------------


def test_split_and_join_round_trip(tmp_path: Path) -> None:
    data = os.urandom(10_000)
    manifest = bb.split_stream(io.BytesIO(data), tmp_path, 3000)
    assert [p["bytes"] for p in manifest["parts"]] == [3000, 3000, 3000, 1000]
    assert manifest["sha256"] == hashlib.sha256(data).hexdigest()
    joined = bb.join_parts(tmp_path, manifest, tmp_path / "joined")
    assert joined.read_bytes() == data
    (tmp_path / manifest["parts"][1]["name"]).write_bytes(b"x" * 3000)
    with pytest.raises(bb.BundleError, match="corrupt"):
        bb.join_parts(tmp_path, manifest, tmp_path / "again")
    (tmp_path / manifest["parts"][1]["name"]).unlink()
    with pytest.raises(bb.BundleError, match="missing"):
        bb.join_parts(tmp_path, manifest, tmp_path / "again")


def test_pack_strips_and_round_trips_through_tar_xz(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "pkg" / "sm100").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("x = 1\n")
    (site / "pkg" / "sm100" / "big.so").write_bytes(os.urandom(5000))
    (site / "bin").mkdir()
    (site / "bin" / "tool").write_text("#!/local/python\n")
    (site / "lib").mkdir()
    (site / "lib" / "libx.a").write_bytes(b"a" * 100)
    (site / "data.bin").write_bytes(os.urandom(20_000))
    removed = bb.strip_site(site, ["pkg/sm100", "lib/*.a", "no/such/thing"])
    assert removed["pkg/sm100"] == 5000 and removed["lib/*.a"] == 100 and removed["no/such/thing"] == 0
    assert not (site / "bin").exists()
    manifest = bb.pack(site, tmp_path / "out", part_size=4096, xz_threads=1, xz_level=1)
    assert len(manifest["parts"]) >= 5 and all(p["bytes"] <= 4096 for p in manifest["parts"])
    joined = bb.join_parts(tmp_path / "out", manifest, tmp_path / "site.tar.xz")
    with tarfile.open(joined) as tar:
        names = sorted(tar.getnames())
        assert names == ["site", "site/data.bin", "site/lib", "site/pkg", "site/pkg/__init__.py"]
        assert tar.extractfile("site/data.bin").read() == (site / "data.bin").read_bytes()  # type: ignore[union-attr]


# --------------------------------------------------------------------------------------
# The committed SGLang lock and the H200 selection
# --------------------------------------------------------------------------------------


def test_sglang_lock_is_complete_for_each_python() -> None:
    text = LOCK.read_text()
    header = bb.lock_header(text)
    assert header["python"].split() == ["3.10", "3.11", "3.12"]
    assert header["requirements"].split() == ["sglang==0.5.11", "kernels==0.12.3", "torch==2.11.0"]
    entries = bb.parse_lock_text(text, str(LOCK))
    for python in ("3.10", "3.11", "3.12"):
        pins = {e.key: e.version for e in bb.entries_for_target(entries, python)}
        assert pins["sglang"] == "0.5.11" and pins["kernels"] == "0.12.3" and pins["torch"] == "2.11.0"
        assert pins["transformers"] == "5.6.0" and pins["flashinfer-python"] == "0.6.8.post1"
        for entry in entries:  # every parent named in '# via' is itself in the lock
            assert set(entry.via) <= {e.key for e in entries}, entry


RECIPE_58 = """annotated-types apache-tvm-ffi asttokens cffi compressed-tensors cuda-tile dill distro easydict
executing fastapi flashinfer-python gguf ipython ipython-pygments-lexers jedi jiter jsonschema
jsonschema-specifications loguru matplotlib-inline msgspec openai openai-harmony opentelemetry-api orjson parso
partial-json-parser pexpect prompt-toolkit ptyprocess pure-eval pybase64 pycparser pydantic pydantic-core
python-multipart pyzmq referencing rpds-py setproctitle sglang sglang-kernel sniffio soundfile stack-data
starlette tokenizers torchao torch-c-dlpack-ext torch-memory-saver traitlets transformers typing-inspection
uvicorn watchfiles wcwidth xgrammar""".split()


def test_h200_selection_carries_the_proven_set() -> None:
    chosen = {bb.normalize_name(pin.split("==")[0]) for pin in ga.prepare.current_selection(LOCK)}
    assert len(RECIPE_58) == 58 and set(RECIPE_58) <= chosen
    # sglang.bench_serving imports datasets; interegular is a declared sglang dependency
    assert chosen - set(RECIPE_58) == {"datasets", "multiprocess", "interegular"}
    assert not {"torch", "triton", "kernels", "flashinfer-cubin"} & chosen
    assert not any(name.startswith("nvidia-") for name in chosen)


# --------------------------------------------------------------------------------------
# lock-profile
# --------------------------------------------------------------------------------------


def test_marker_for_partitions_the_targets() -> None:
    targets = ["3.10", "3.11", "3.12"]
    assert lp.marker_for(targets, targets) == ""
    assert lp.marker_for(["3.10"], targets) == 'python_version < "3.11"'
    assert lp.marker_for(["3.11", "3.12"], targets) == 'python_version >= "3.11"'
    assert lp.marker_for(["3.11"], targets) == 'python_version >= "3.11" and python_version < "3.12"'
    assert lp.marker_for(["3.10", "3.12"], targets) == 'python_version == "3.10" or python_version == "3.12"'


def report(
    python: str, items: list[tuple[str, str, list[str], bool]], extras: dict[str, list[str]] | None = None
) -> dict[str, Any]:
    """A minimal pip --report: (name, version, requires_dist, requested)."""
    env = bb.marker_environment(python)
    return {
        "environment": env,
        "install": [
            {
                "requested": req,
                "requested_extras": (extras or {}).get(name),
                "metadata": {"name": name, "version": version, "requires_dist": deps},
            }
            for name, version, deps, req in items
        ],
    }


def test_merge_writes_markers_and_via_and_self_checks() -> None:
    reports = {
        "3.10": report(
            "3.10",
            [
                ("app", "1.0", ["lib[fast]", 'old>=1 ; python_version < "3.11"'], True),
                ("lib", "2.0", ['speed ; extra == "fast"', 'unused ; extra == "slow"'], False),
                ("speed", "1.0", [], False),
                ("old", "1.1", [], False),
            ],
        ),
        "3.12": report(
            "3.12",
            [
                ("app", "1.0", ["lib[fast]", 'old>=1 ; python_version < "3.11"'], True),
                ("lib", "2.1", ['speed ; extra == "fast"'], False),
                ("speed", "1.0", [], False),
            ],
        ),
    }
    lines = lp.merge(reports)
    assert lines == [
        "app==1.0  # requested",
        'lib==2.0 ; python_version < "3.12"  # via app',
        'lib==2.1 ; python_version >= "3.12"  # via app',
        'old==1.1 ; python_version < "3.12"  # via app',
        "speed==1.0  # via lib",
    ]
    text = lp.render("t", ["app==1.0"], ["3.10", "3.12"], [], "https://example.invalid/simple", lines, Path("x"))
    lp.check(text, reports)
    with pytest.raises(bb.BundleError, match="does not reproduce"):
        lp.check(text.replace("speed==1.0", "speed==9.9"), reports)


# --------------------------------------------------------------------------------------
# gpu-acceptance
# --------------------------------------------------------------------------------------


def plan_dict(tmp: Path) -> dict[str, Any]:
    return {
        "argv": [
            str(tmp / "venv" / "bin" / "sglang"),
            "serve",
            "--model-path",
            str(tmp / "models" / "tiny"),
            "--tensor-parallel-size",
            "2",
            "--host",
            "0.0.0.0",
            "--port=30111",
            "--mem-fraction-static",
            "0.5",
        ],
        "env": {
            "SGLANG_ENABLE_SPEC_V2": "1",
            "TRITON_CACHE_DIR": str(tmp / "cache" / "triton"),
            "NCCL_NVLS_ENABLE": "1",
            "API_KEY": "s3cret",
        },
        "notes": [],
    }


def test_plan_is_read_not_built(tmp_path: Path) -> None:
    plan = ga.common.Plan.from_dict(plan_dict(tmp_path))
    assert plan.venv_dir == tmp_path / "venv" and plan.model_path == tmp_path / "models" / "tiny"
    assert plan.port == 30111 and plan.url == "http://127.0.0.1:30111"
    for bad in ({"argv": ["python", "-m", "sglang.launch_server"]}, {"argv": ["/v/bin/sglang", "serve"]}, []):
        with pytest.raises(ga.common.AcceptanceError):
            ga.common.Plan.from_dict(bad)


def test_plan_renders_through_the_role(tmp_path: Path) -> None:
    """prepare's plan comes from tools/launch-plan (the role's plan.yml) for the acceptance
    host: the sglang_servers settings, the role's cache environment, the one override."""
    config = tmp_path / "config.json"
    config.write_text((REPO / "files" / "models" / "qwen3.6-27b.config.json").read_text())
    plan = ga.common.Plan.from_dict(ga.prepare.render_plan(config, 18_000_000, "/root/models/tiny"))
    lock_sha = hashlib.sha256((REPO / "roles/ml_env/files/locks/sglang-0.5.11.txt").read_bytes()).hexdigest()
    assert plan.venv_dir == Path(f"/root/ml-env.d/{lock_sha[:12]}") and plan.model_path == Path("/root/models/tiny")
    assert ga.common.flag_value(plan.argv, "--mem-fraction-static") == "0.5"
    assert ga.common.flag_value(plan.argv, "--speculative-algorithm") == "NEXTN"
    assert plan.env["SGLANG_ENABLE_SPEC_V2"] == "1"
    assert plan.env["TRITON_CACHE_DIR"].startswith("/var/cache/inference-server")


def test_server_env_is_the_plan_env_plus_device_allowances(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    plan = ga.common.Plan.from_dict(plan_dict(tmp_path))
    env, added = ga.processes.server_env(plan)
    assert "PYTHONPATH" not in env
    assert env["SGLANG_ENABLE_SPEC_V2"] == "1" and env["TRITON_CACHE_DIR"] == plan.env["TRITON_CACHE_DIR"]
    assert env["NCCL_NVLS_ENABLE"] == "0" and added["NCCL_NVLS_ENABLE"] == "0"  # forced, and reported
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" and env["NVSHMEM_DISABLE_NVLS"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1" and "SGLANG_ENABLE_SPEC_V2" not in added
    assert ga.processes.cache_dirs(plan.env) == [tmp_path / "cache" / "triton"]
    assert ga.common.masked(plan.env)["API_KEY"] == "***"


def test_jit_cache_folders_follow_the_plan(tmp_path: Path) -> None:
    env = {
        "HOME": str(tmp_path / "home"),
        "TRITON_CACHE_DIR": str(tmp_path / "triton"),
        "CUDA_HOME": "/usr/local/cuda",
        "PATH": "/usr/bin:/bin",
    }
    assert ga.processes.cache_dirs(env) == [tmp_path / "home", tmp_path / "triton"]
    (tmp_path / "home" / ".cache" / "flashinfer").mkdir(parents=True)
    (tmp_path / "home" / ".cache" / "flashinfer" / "k.so").write_bytes(b"x" * 10)
    sizes = ga.processes.jit_cache_sizes(env)
    assert sizes[str(tmp_path / "home" / ".cache" / "flashinfer")] == 10
    assert sizes[str(tmp_path / "triton")] == 0


def test_bundle_folders_follow_the_part_size() -> None:
    files = [
        ("site.tar.xz.part000", 56 * 2**20),
        ("site.tar.xz.part001", 56 * 2**20),
        ("site.tar.xz.part002", 40 * 2**20),
        ("model.tar.gz", 14 * 2**20),
    ]
    assert ga.prepare.split_folders(files, None) == [[name for name, _ in files]]  # no part size: one folder
    folders = ga.prepare.split_folders(files, 56 * 2**20)
    assert folders == [["site.tar.xz.part000"], ["site.tar.xz.part001"], ["site.tar.xz.part002", "model.tar.gz"]]
    with pytest.raises(ga.common.AcceptanceError):
        ga.prepare.split_folders([("huge", 57 * 2**20)], 56 * 2**20)
    commands = ga.prepare.run_commands(["1", "2", "3"], ".gpuw")
    assert commands[0] == "python3 tools/gpu-acceptance run .gpuw/1 .gpuw/2 .gpuw/3"
    assert commands[1:4] == [f"python3 tools/gpu-acceptance receive .gpuw/{i}" for i in (1, 2, 3)]
    assert commands[4] == "python3 tools/gpu-acceptance check" and commands[-1].endswith(" collect")
    assert "--part-size" in ga.prepare.bundle_args(LOCK, Path("w"), Path("p"), "56M")
    assert "--part-size" not in ga.prepare.bundle_args(LOCK, Path("w"), Path("p"))


def test_the_bundle_keeps_the_kernels_the_targets_gpus_load() -> None:
    """sgl_kernel loads sgl_kernel/sm100/ on every GPU but sm90: only an sm90-only bundle drops it."""
    assert ga.common.compute_capability("NVIDIA RTX A6000") == 86
    assert ga.common.compute_capability("NVIDIA H200") == 90
    assert ga.common.compute_capability("NVIDIA H100 80GB HBM3") == 90
    assert ga.common.compute_capability("NVIDIA A100-SXM4-80GB") == 80
    assert ga.common.compute_capability("Some Future GPU") is None

    def stripped(gpus: list[str]) -> list[str]:
        args = ga.prepare.bundle_args(LOCK, Path("w"), Path("p"), strips=ga.common.strips_for(gpus))
        return [args[i + 1] for i, arg in enumerate(args) if arg == "--strip"]

    hopper = stripped(["NVIDIA H200", "NVIDIA H200"])
    assert "sgl_kernel/sm100" in hopper and "sgl_kernel/flashmla_ops.abi3.so" in hopper
    # ct129's two RTX A6000 (sm86), a mixed host, unknown or no names: the sm100 build travels.
    for gpus in (["NVIDIA RTX A6000"] * 2, ["NVIDIA H200", "NVIDIA RTX A6000"], ["Some Future GPU"], []):
        kept = stripped(gpus)
        assert "sgl_kernel/sm100" not in kept, gpus
        assert "sgl_kernel/flashmla_ops.abi3.so" in kept
    # The acceptance inventory's host (2x H200) gets the Hopper bundle.
    names = [gpu["name"] for gpu in ga.prepare.acceptance_offline_plan()["gpus"]]
    assert ga.common.strips_for(names) == ga.common.STRIP + ga.common.STRIP_SM90_ONLY


def test_a_bundle_packed_for_other_gpus_is_packed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A packed bundle is reused only when it left out exactly what this target's GPUs allow (besides what every
    pack leaves out: its manifest lists those too, which once made every pack look stale and built again)."""
    pack = tmp_path / "pack"
    pack.mkdir()
    hopper = ga.common.strips_for(["NVIDIA H200"])
    manifest = {
        "lock_sha256": ga.prepare.bundle.sha256_file(LOCK),
        "packages": ga.prepare.current_selection(LOCK),
        "stripped_bytes": {pattern: 1 for pattern in [*ga.prepare.bundle.ALWAYS_STRIPPED, *hopper]},
        "parts": [{"name": "site.tar.xz", "bytes": 1}],
        "bytes": 1,
    }
    (pack / "site.tar.xz").write_bytes(b"x")
    (pack / ga.prepare.bundle.PACK_MANIFEST).write_text(json.dumps(manifest))
    built: list[list[str]] = []
    monkeypatch.setattr(ga.prepare.bundle, "main", lambda args: built.append(args) or 0)
    assert ga.prepare.ensure_bundle(LOCK, tmp_path / "w", pack, False, strips=hopper) == manifest
    assert built == []
    ga.prepare.ensure_bundle(LOCK, tmp_path / "w", pack, False, strips=ga.common.strips_for(["NVIDIA RTX A6000"]))
    assert len(built) == 1 and "sgl_kernel/sm100" not in built[0]


def test_original_flags_error_is_found_in_a_log() -> None:
    log = (
        '[2026-11-29] server_args=...\nTraceback (most recent call last):\n  File "x", line 1\n'
        "ValueError: Speculative decoding for Qwen3_5ForConditionalGeneration is not compatible with radix "
        "cache when using --mamba-scheduler-strategy no_buffer.To use radix cache ...\n"
    )
    error = ga.measure.error_line(log)
    assert error is not None and error.startswith("ValueError: Speculative decoding")
    assert ga.common.EXPECTED_REFUSAL in error
    assert ga.common.ORIGINAL_FLAGS[:4] == ["--speculative-algorithm", "NEXTN", "--speculative-num-draft-tokens", "1"]


def test_reports_are_read_tolerantly() -> None:
    text = (
        'waiting...\n{"partial": 1}\nnoise {"passed": true, "measure": {"decode_tps": 97.5, "sglang": '
        '{"accept_length": 1.02}}, "prompts": ["a", "b"]}\n'
    )
    found = ga.measure.last_json_object(text)
    assert ga.measure.find_value(found, ["decode_tps"]) == 97.5
    assert ga.measure.find_value(found, ["accept_length"]) == 1.02
    assert ga.measure.last_json_object("no json") is None


def test_gate_figures_follow_the_gate_report_schema() -> None:
    """Per-request means, not the aggregate's totals or the first request's figure."""
    report = {
        "aggregate": {
            "requests": 8,
            "prompt_tokens": 2756,
            "completion_tokens": 1981,
            "decode_tps_mean": 118.875,
            "decode_tps_min": 104.448,
        },
        "settings": {"max_tokens": 256},
        "speculative": {"accept_length": 1.001},
        "requests": [{"decode_tps": 104.448, "prompt_tokens": 354}],
    }
    assert ga.measure.gate_figures(report) == {
        "tps": 118.875,
        "accept_length": 1.001,
        "prompt_tokens": 344,
        "output_len": 256,
    }


def test_bench_prompts_are_the_gates_own_texts() -> None:
    texts = ga.measure.gate_prompts()
    prompts = json.loads((REPO / "roles/health_gate/files/prompts.json").read_text())["prompts"]
    assert len(texts) == len(prompts)
    assert all(len(t) > 40 for t in texts)


def test_summary_has_the_issue_keys() -> None:
    state = {
        "servers": {"cold": {"ready_s": 290.0}, "warm": {"ready_s": 40.0}},
        "gate": {
            "cold": {
                "passed": True,
                "tps": 100.0,
                "accept_length": 1.01,
                "source": "tools/health-gate",
                "probe": {
                    "server_info": {
                        "version": "0.5.11",
                        "tp_size": 2,
                        "speculative_algorithm": "EAGLE",
                        "mamba_scheduler_strategy": "extra_buffer",
                    }
                },
            }
        },
        "bench": {"cold": {"tps": 104.0, "tps_metric": "tpot"}},
        "original_flags": {"error": "ValueError: ... not compatible with radix cache ..."},
    }
    summary = ga.report.summarize(
        state, {"plan": {"argv": ["/v/bin/sglang", "serve", "--speculative-algorithm", "NEXTN"]}}
    )
    required = (
        "launched ready_s gate_passed gate_tps accept_length sglang_version tp_size speculative_algorithm "
        "mamba_scheduler_strategy original_flags_error bench_serving_tps tps_ratio cold_ready_s warm_ready_s"
    ).split()
    assert all(key in summary for key in required)
    assert summary["launched"] is True and summary["tps_ratio"] == round(100 / 104, 3)
    assert summary["speculative_algorithm_requested"] == "NEXTN"
    json.dumps(summary)


def test_ratio_pairs_the_gate_and_bench_of_the_same_server() -> None:
    """Never a cold gate against a warm bench: each server's pair, the latest one headlined."""
    state = {
        "servers": {"cold": {"ready_s": 300.0}, "warm": {"ready_s": 70.0}},
        "gate": {"cold": {"passed": True, "tps": 135.5}, "warm": {"passed": True, "tps": 115.5}},
        "bench": {"cold": {"tps": 99.5}, "warm": {"tps": 115.3}},
    }
    summary = ga.report.summarize(state, None)
    assert summary["tps_pairs"]["cold"]["ratio"] == round(135.5 / 99.5, 3)
    assert (summary["tps_ratio_server"], summary["tps_ratio"]) == ("warm", round(115.5 / 115.3, 3))
    assert summary["gate_tps"] == 115.5 and summary["bench_serving_tps"] == 115.3
    state["gate"]["warm"]["passed"] = False
    assert ga.report.summarize(state, None)["gate_passed"] is False


def test_the_report_keeps_each_gates_eval_and_says_what_the_model_is() -> None:
    """A carried (trained) model's eval is the headline's and each gate's; the notes name the model and the plan's
    own --mem-fraction-static; random weights are said to be random; the GPUs are those check recorded."""
    correctness = {"eval": {"correct": 283, "count": 300, "score": 0.9433, "items": []}, "golden": {"a": {}, "b": {}},
                   "consistency": [{}, {}, {}]}  # fmt: skip
    state = {
        "check": {"gpus": ["NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB"]},
        "gate": {"cold": {"passed": True, "report": {"correctness": correctness}}, "warm": {"passed": True}},
    }
    argv = ["/v/bin/sglang", "serve", "--mem-fraction-static", "0.45"]
    carried = ga.report.summarize(state, {"plan": {"argv": argv}, "model": {"carried": True}})
    assert carried["eval_score"] == 0.9433
    assert carried["gate"]["cold"]["correctness"] == {
        "eval": {"correct": 283, "count": 300, "score": 0.9433}, "golden_prompts": 2, "consistency_prompts": 3,
    }  # fmt: skip
    assert carried["gate"]["warm"]["correctness"] == {}
    assert carried["notes"][0].startswith("The model was carried") and "0.45 is the tiny-model" in carried["notes"][1]
    assert carried["device"]["gpus"] == state["check"]["gpus"]
    generated = ga.report.summarize(state, {"plan": {"argv": argv[:2]}, "model": {"carried": False}})
    assert generated["notes"][0].startswith("The weights are random") and "sets no --mem" in generated["notes"][1]


@pytest.mark.parametrize(
    ("gpus", "title"),
    [
        (["NVIDIA H200, 580.159.04, 143771 MiB"], "1x NVIDIA H200"),
        (["NVIDIA RTX A6000, 550.54, 49140 MiB"] * 2, "2x NVIDIA RTX A6000"),
        (["NVIDIA H200, 5, 1 MiB", "NVIDIA L4, 5, 1 MiB"], "1x NVIDIA H200 + 1x NVIDIA L4"),
        ([], "an unknown GPU host"),
    ],
)
def test_the_report_names_the_gpus_it_ran_on(gpus: list[str], title: str) -> None:
    assert ga.report.gpus_title({"gpus": gpus}) == title


def test_model_archive_is_deterministic(tmp_path: Path) -> None:
    src = tmp_path / "m"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "sub" / "w.bin").write_bytes(b"123")
    ga.prepare.deterministic_tgz(src, tmp_path / "a.tgz", "model")
    os.utime(src / "config.json", (1, 1))
    ga.prepare.deterministic_tgz(src, tmp_path / "b.tgz", "model")
    assert (tmp_path / "a.tgz").read_bytes() == (tmp_path / "b.tgz").read_bytes()
    with tarfile.open(tmp_path / "a.tgz") as tar:
        assert tar.getnames() == ["model", "model/config.json", "model/sub", "model/sub/w.bin"]


def test_prepare_carries_a_trained_model_instead_of_generating_one(tmp_path: Path) -> None:
    """``prepare --model DIR``: the bundle's model is a copy of DIR (a trained acceptance model), archived
    once and again only when DIR changes; a directory without a model is refused in one sentence."""
    trained = tmp_path / "trained"
    trained.mkdir()
    (trained / "config.json").write_text('{"model_type": "qwen3_5"}')
    (trained / "model-00001-of-00001.safetensors").write_bytes(b"trained weights")
    (trained / "model-00001-of-00001.safetensors").chmod(0o400)
    out = tmp_path / "out"
    out.mkdir()
    never = str(tmp_path / "no-python")  # generating a model would fail: the copy must not need one
    model = ga.prepare.ensure_model(out, never, False, trained)
    assert (out / "model" / "model-00001-of-00001.safetensors").read_bytes() == b"trained weights"
    assert (out / "model" / "model-00001-of-00001.safetensors").stat().st_mode & 0o777 == 0o644
    assert model["weights_bytes"] == len(b"trained weights") and model["config"] == {"model_type": "qwen3_5"}
    with tarfile.open(out / ga.common.MODEL_ARCHIVE) as tar:
        assert "model/model-00001-of-00001.safetensors" in tar.getnames()
    assert ga.prepare.ensure_model(out, never, False, trained)["sha256"] == model["sha256"]
    (trained / "model-00001-of-00001.safetensors").chmod(0o600)
    (trained / "model-00001-of-00001.safetensors").write_bytes(b"retrained")
    assert ga.prepare.ensure_model(out, never, False, trained)["sha256"] != model["sha256"]
    with pytest.raises(ga.common.AcceptanceError, match="--model .*: no config.json and safetensors there"):
        ga.prepare.ensure_model(out, never, False, tmp_path / "empty")


@pytest.mark.parametrize("binaries", [True, False], ids=["xz-and-tar", "python-lzma"])
def test_unpack_site_with_and_without_binaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, binaries: bool) -> None:
    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    payload = os.urandom(300_000)
    (site / "pkg" / "data.bin").write_bytes(payload)
    manifest = bb.pack(site, tmp_path / "parts", part_size=50_000, xz_threads=1, xz_level=1)
    if not binaries:
        monkeypatch.setattr(ga.install.shutil, "which", lambda name: None)
    dest = tmp_path / "dest"
    dest.mkdir()
    ga.install.unpack_site(tmp_path / "parts", manifest, dest)
    assert (dest / "pkg" / "data.bin").read_bytes() == payload


def test_receive_and_install_on_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The device's install path end to end with a fake bundle: venv, site tree, console
    scripts, image site .pth, model at the plan's path."""
    site = tmp_path / "build" / "site"
    (site / "fakepkg").mkdir(parents=True)
    (site / "fakepkg" / "__init__.py").write_text("def main():\n    print('fake sglang ran')\n    return 0\n")
    dist = site / "fakepkg-1.0.dist-info"
    dist.mkdir()
    (dist / "entry_points.txt").write_text("[console_scripts]\nsglang = fakepkg:main\n")
    packed = bb.pack(site, tmp_path / "pack", part_size=512, xz_threads=1, xz_level=1)
    packed["python_version"] = f"{sys.version_info.major}.{sys.version_info.minor}"
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"model_type": "qwen3_5"}')
    ga.prepare.deterministic_tgz(tmp_path / "model", tmp_path / "pack" / ga.common.MODEL_ARCHIVE, "model")
    model = {"archive": ga.common.MODEL_ARCHIVE, "sha256": bb.sha256_file(tmp_path / "pack" / ga.common.MODEL_ARCHIVE)}
    manifest = {"bundle": packed, "model": model, "plan": plan_dict(tmp_path)}
    carried = tmp_path / "carried"
    carried.mkdir()
    for name in [p["name"] for p in packed["parts"]] + [ga.common.MODEL_ARCHIVE]:
        (carried / name).write_bytes((tmp_path / "pack" / name).read_bytes())
    (carried / ga.common.MANIFEST).write_text(json.dumps(manifest))
    dev = ga.device.Device(tmp_path / "state")
    assert ga.device.cmd_receive(argparse.Namespace(folder=carried), dev) == 0
    monkeypatch.setattr(ga.install, "IMPORT_CHECK", "import json; print(json.dumps({'import_s': 0, 'sglang': 'fake'}))")
    assert ga.install.cmd_install(argparse.Namespace(), dev) == 0
    venv_dir = tmp_path / "venv"
    out = subprocess.run([str(venv_dir / "bin" / "sglang")], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "fake sglang ran"
    assert (tmp_path / "models" / "tiny" / "config.json").is_file()
    assert (ga.install.site_packages(venv_dir) / "_gpu_acceptance_image_site.pth").is_file()
    assert dev.load()["install"]["console_scripts"] == 1


# --------------------------------------------------------------------------------------
# make-tiny-model --vision --with-mtp (needs the CPU lock's venv: torch, transformers)
# --------------------------------------------------------------------------------------


def model_python() -> str:
    """The transformers-cpu venv's python that CI builds before pytest (make tools-venv)."""
    cache = Path(os.environ.get("DEPLOY_CACHE_DIR", REPO / ".cache"))
    python = cache / "venvs" / "transformers-cpu" / "bin" / "python"
    if not python.is_file():
        pytest.fail(f"{python} is missing: run `make tools-venv` (CI builds it before pytest)")
    return str(python)


@pytest.fixture(scope="module")
def acceptance_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    python = model_python()
    dirs = []
    for run in ("a", "b"):
        out = tmp_path_factory.mktemp("tiny") / run
        subprocess.run(
            [python, str(REPO / "tools" / "make-tiny-model"), "--out", str(out), "--vision", "--with-mtp"],
            check=True,
            capture_output=True,
        )
        dirs.append(out)
    return dirs[0], dirs[1]


def test_acceptance_model_is_deterministic(acceptance_models: tuple[Path, Path]) -> None:
    first, second = acceptance_models
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_acceptance_model_mirrors_qwen36_27b(acceptance_models: tuple[Path, Path]) -> None:
    model = acceptance_models[0]
    cfg = json.loads((model / "config.json").read_text())
    real = json.loads((REPO / "files" / "models" / "qwen3.6-27b.config.json").read_text())
    text, vision = cfg["text_config"], cfg["vision_config"]
    assert cfg["architectures"] == ["Qwen3_5ForConditionalGeneration"] and cfg["model_type"] == "qwen3_5"
    assert text["num_attention_heads"] == 4 and text["num_key_value_heads"] == 2 and text["head_dim"] == 256
    assert text["linear_num_key_heads"] % 2 == 0 and text["linear_num_value_heads"] % 2 == 0
    assert text["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert text["mamba_ssm_dtype"] == "float32" and text["mtp_num_hidden_layers"] == 1
    assert text["rope_parameters"] == real["text_config"]["rope_parameters"]
    assert vision["depth"] == 1 and vision["deepstack_visual_indexes"] == []
    assert vision["out_hidden_size"] == text["hidden_size"]
    assert set(cfg) == set(real) and set(text) == set(real["text_config"])
    weight_map = json.loads((model / "model.safetensors.index.json").read_text())["weight_map"]
    mtp = {k for k in weight_map if k.startswith("mtp.")}
    assert {
        "mtp.fc.weight",
        "mtp.pre_fc_norm_embedding.weight",
        "mtp.pre_fc_norm_hidden.weight",
        "mtp.norm.weight",
        "mtp.layers.0.self_attn.q_proj.weight",
        "mtp.layers.0.mlp.down_proj.weight",
    } <= mtp
    assert any(k.startswith("model.visual.") for k in weight_map) and "lm_head.weight" in weight_map
    for name in ("preprocessor_config.json", "video_preprocessor_config.json", "tokenizer.json", "chat_template.json"):
        assert (model / name).is_file()


def test_acceptance_model_loads_with_transformers(acceptance_models: tuple[Path, Path]) -> None:
    script = (
        "import sys, json, torch\n"
        "from transformers import AutoTokenizer, Qwen3_5ForConditionalGeneration\n"
        "from safetensors import safe_open\n"
        "m = Qwen3_5ForConditionalGeneration.from_pretrained(sys.argv[1], dtype=torch.bfloat16)\n"
        "tok = AutoTokenizer.from_pretrained(sys.argv[1])\n"
        "ids = tok.apply_chat_template([{'role': 'user', 'content': 'hi'}], add_generation_prompt=True,"
        " return_tensors='pt', return_dict=True)\n"
        "out = m.generate(**ids, max_new_tokens=4, do_sample=False)\n"
        "idx = json.load(open(sys.argv[1] + '/model.safetensors.index.json'))['weight_map']\n"
        "f = idx['mtp.fc.weight']\n"
        "with safe_open(sys.argv[1] + '/' + f, 'pt') as fh: shape = list(fh.get_tensor('mtp.fc.weight').shape)\n"
        "print(json.dumps({'new_tokens': out.shape[1] - ids['input_ids'].shape[1], 'fc': shape}))\n"
    )
    done = subprocess.run([model_python(), "-c", script, str(acceptance_models[0])], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"new_tokens": 4, "fc": [256, 512]}


# --------------------------------------------------------------------------------------
# The device steps end to end against a fake SGLang (CPU): launch, wait, gate fallback,
# bench plumbing, original flags, restart, collect.
# --------------------------------------------------------------------------------------

FAKE_SERVER = r"""
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# tests/shared/fake_sglang_lm.py's toy model, beside this file (its fake_http at the top of the
# site-packages): the correctness probe's calls.
# With speculative decoding off (no SGLANG_ENABLE_SPEC_V2) it answers as FAKE_LM_NO_SPEC_MODE says.
from sglang.toy_lm import ToyLM

LM = ToyLM("ok" if os.environ.get("SGLANG_ENABLE_SPEC_V2") else os.environ.get("FAKE_LM_NO_SPEC_MODE", "ok"))

START = time.time()
# Seconds between two streamed tokens (0: the whole answer at once) and the running-request limit.
DELAY = float(os.environ.get("FAKE_TOKEN_DELAY_S", "0"))
RUNNING = int(os.environ.get("FAKE_RUNNING", "48"))


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def send(self, code, body, ctype="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self.send(200 if time.time() - START > 0.5 else 503, {})
        elif self.path == "/server_info":
            self.send(200, {"version": os.environ.get("FAKE_VERSION", "0.5.11"), "tp_size": 2,
                            "speculative_algorithm": "EAGLE", "mamba_scheduler_strategy": "extra_buffer",
                            "internal_states": [{"avg_spec_accept_length": 1.01,
                                                 "effective_max_running_requests_per_dp": RUNNING}]})
        elif self.path == "/metrics":
            self.send(200, b"sglang:num_running_reqs 0\n", "text/plain")
        elif self.path == "/v1/models":
            self.send(200, {"data": [{"id": "tiny"}]})
        else:
            self.send(404, {})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path.partition("?")[0] == "/flush_cache":
            LM.flush()
            self.send(200, b"Cache flushed.", "text/plain")
            return
        if self.path == "/tokenize":
            self.send(200, {"tokens": LM.tokenize(body["prompt"])})
            return
        if self.path == "/generate" and "input_ids" in body:
            self.send(200, LM.generate(body))
            return
        if self.path == "/generate":
            self.send(200, {"text": "x", "meta_info": {"completion_tokens": 64, "spec_accept_length": 1.0}})
            return
        if self.path == "/v1/chat/completions" and not body.get("stream"):
            message = {"role": "assistant", "content": LM.chat(body["messages"][-1]["content"])}
            self.send(200, {"choices": [{"index": 0, "message": message}]})
            return
        n = body["max_tokens"]
        chunks = [{"choices": [{"delta": {"content": "t"}}]} for _ in range(n)]
        chunks.append({"choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": n}})
        if not DELAY:
            stream = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
            self.send(200, stream, "text/event-stream")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for chunk in chunks:
            time.sleep(DELAY)
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")


def main():
    port = int(sys.argv[sys.argv.index("--port") + 1])
    if "perturbed" in sys.argv[sys.argv.index("--model-path") + 1]:
        LM.mode = "wrong_answers"  # another revision of the model: it lost its answers
    if any(word.startswith("--kv-cache-dtype") for word in sys.argv):
        LM.mode = "broken"  # the stand-in's setting that breaks its tokens (real SGLang's fp8 KV cache does not)
    print("env SGLANG_ENABLE_SPEC_V2=" + os.environ.get("SGLANG_ENABLE_SPEC_V2", "unset"), flush=True)
    print("env NCCL_NVLS_ENABLE=" + os.environ.get("NCCL_NVLS_ENABLE", "unset"), flush=True)
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""

FAKE_LAUNCH_SERVER = (
    "raise ValueError('Speculative decoding for Qwen3_5ForConditionalGeneration is not compatible with radix cache "
    "when using --mamba-scheduler-strategy no_buffer.To use radix cache with speculative decoding, please use "
    "--mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1.')\n"
)

FAKE_BENCH = (
    "import json, sys\n"
    "out = sys.argv[sys.argv.index('--output-file') + 1]\n"
    "open(out, 'a').write(json.dumps({'completed': 8, 'output_throughput': 90.0, 'mean_tpot_ms': 10.0,"
    " 'accept_length': 1.0, 'max_concurrency': 1}) + '\\n')\n"
)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fake_bundle(root: Path, port: int, env: dict[str, str] | None = None, gate_args: list[str] | None = None) -> Path:
    """A prepared folder under ``root`` whose 'sglang' is FAKE_SERVER on ``port`` (plan env plus ``env``)."""
    site = root / "build" / "site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang" / "fake_server.py").write_text(FAKE_SERVER)
    shared = Path(__file__).parents[1] / "shared"
    (site / "sglang" / "toy_lm.py").write_text((shared / "fake_sglang_lm.py").read_text())
    (site / "sglang" / "known_answers.json").write_text(json.dumps(fake_sglang_lm.KNOWN))  # its evals' answers
    (site / "fake_http.py").write_text((shared / "fake_http.py").read_text())  # what toy_lm.py imports
    (site / "sglang" / "launch_server.py").write_text(FAKE_LAUNCH_SERVER)
    (site / "sglang" / "bench_serving.py").write_text(FAKE_BENCH)
    (site / "sglang-0.5.11.dist-info").mkdir()
    (site / "sglang-0.5.11.dist-info" / "entry_points.txt").write_text(
        "[console_scripts]\nsglang = sglang.fake_server:main\n"
    )
    packed = bb.pack(site, root / "pack", part_size=1 << 20, xz_threads=1, xz_level=1)
    (root / "m").mkdir()
    (root / "m" / "config.json").write_text("{}")
    ga.prepare.deterministic_tgz(root / "m", root / "pack" / ga.common.MODEL_ARCHIVE, "model")
    plan = plan_dict(root)
    plan["argv"] = [a if not a.startswith("--port=") else f"--port={port}" for a in plan["argv"]]
    plan["argv"] += ["--port", str(port)]
    plan["env"].update(env or {})
    manifest = {
        "bundle": packed,
        "plan": plan,
        "gate_args": gate_args or [],
        "model": {
            "archive": ga.common.MODEL_ARCHIVE,
            "sha256": bb.sha256_file(root / "pack" / ga.common.MODEL_ARCHIVE),
        },
        "bench": {"input_len": 16, "output_len": 32, "num_prompts": 2, "max_concurrency": 1, "tps_metric": "tpot"},
    }
    (root / "pack" / ga.common.MANIFEST).write_text(json.dumps(manifest))
    (root / "pack" / bb.PACK_MANIFEST).unlink(missing_ok=True)
    return root / "pack"


def test_device_steps_against_a_fake_sglang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    pack = fake_bundle(tmp_path, port)
    dev = ga.device.Device(tmp_path / "state")
    monkeypatch.setattr(ga.install, "IMPORT_CHECK", "print('{\"import_s\": 0}')")
    monkeypatch.setattr(ga.measure, "GATE_CLI", tmp_path / "no-gate")
    monkeypatch.setattr(
        ga.measure,
        "ORIGINAL_FLAGS",
        [*ga.common.ORIGINAL_FLAGS[:-7], "--port", str(free_port()), *ga.common.ORIGINAL_FLAGS[-5:]],
    )
    ns = argparse.Namespace
    try:
        assert ga.device.cmd_receive(ns(folder=pack), dev) == 0
        assert ga.install.cmd_install(ns(), dev) == 0
        assert ga.measure.cmd_original_flags(ns(timeout=60), dev) == 0
        assert ga.processes.cmd_launch(ns(name="cold"), dev) == 0
        assert ga.processes.cmd_wait(ns(name="cold", timeout=30, interval=0.2), dev) == 0
        assert ga.measure.cmd_gate(ns(name="cold", timeout=60, gate_args=[]), dev) == 0
        assert (
            ga.measure.cmd_bench(ns(name="cold", input_len=None, output_len=None, num_prompts=None, timeout=60), dev)
            == 0
        )
        assert ga.processes.cmd_restart(ns(old="cold", new="warm", timeout=30), dev) == 0
        assert ga.report.cmd_collect(ns(out=tmp_path / "out"), dev) == 0
    finally:
        for record in dev.load().get("servers", {}).values():
            ga.processes.stop_session(record["pid"], grace_s=5)
    summary = json.loads((tmp_path / "out" / "gpu_acceptance.json").read_text())
    assert summary["launched"] is True and summary["warm_ready_s"] is not None
    assert summary["gate_passed"] is None and summary["gate_source"].startswith("gpu-acceptance fallback")
    assert summary["sglang_version"] == "0.5.11" and summary["tp_size"] == 2
    assert summary["speculative_algorithm"] == "EAGLE" and summary["mamba_scheduler_strategy"] == "extra_buffer"
    assert "not compatible with radix cache" in summary["original_flags_error"]
    assert summary["bench_serving_tps"] == 100.0 and summary["tps_ratio"] is not None
    assert summary["bench_serving"]["cold"]["output_len"] == 32
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "gpu_acceptance.json",
        "gpu_acceptance.md",
        "logs.tar.gz",
    ]
    log = (dev.logs / "server-cold.log").read_text()
    assert "env SGLANG_ENABLE_SPEC_V2=1" in log and "env NCCL_NVLS_ENABLE=0" in log
    assert not ga.processes.port_open(port)


def test_run_stops_at_the_first_failure_and_still_collects(tmp_path: Path) -> None:
    """``run`` on a folder that prepare did not write: receive fails, no step runs, collect writes."""
    (tmp_path / "not-a-bundle").mkdir()
    code = ga.cli.main(
        ["--state", str(tmp_path / "state"), "run", str(tmp_path / "not-a-bundle"), "--out", str(tmp_path / "out")]
    )
    assert code == 1
    assert not (tmp_path / "state" / "state.json").exists() or "install" not in json.loads(
        (tmp_path / "state" / "state.json").read_text()
    )
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "gpu_acceptance.json",
        "gpu_acceptance.md",
        "logs.tar.gz",
    ]


def test_process_users_counts_each_process_by_its_real_uid() -> None:
    """What the launch record's ``process_users`` says of a server's session: every process by real uid."""
    import pwd

    me = pwd.getpwuid(os.getuid()).pw_name
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert ga.processes.process_users([os.getpid(), child.pid]) == {me: 2}
        assert ga.processes.process_users([2**22 + 7]) == {}  # a pid that does not exist is left out
    finally:
        child.kill()
        child.wait()
