"""GPU acceptance for any GPU host: serve the tiny Qwen3.6-27B-shaped model with real SGLang exactly as our unit would.

Controller side (no GPU needed):

    tools/gpu-acceptance prepare [--out .gpuw] [--part-size SIZE]

builds the bundle, everything the GPU host needs besides the repository checkout: the SGLang
lock's wheels for the target image (Python 3.12, minus what the image provides), installed
into a site tree, stripped and packed with ``tar | xz``; the tiny model
(``tools/make-tiny-model --vision --with-mtp``); the launch plan rendered by
``filter_plugins/launch_plan.py`` (the same code path as the ``inference_server`` role) for
a 2x H200 host, plus the tiny-model allowance ``--mem-fraction-static 0.5``. The files go
into the numbered folder ``.gpuw/1``, or, with ``--part-size SIZE`` (for a transport with a
limit per transfer), are split into parts and spread over ``.gpuw/1``, ``.gpuw/2``, ... of
at most SIZE each. It writes ``.gpuw/acceptance.json`` (the manifest, also in each folder)
and ``.gpuw/run.md`` (the GPU host's commands).

GPU host side (any Linux machine with the plan's GPUs that the operator can reach or is
logged in to; run from the repository root with the image's python3):

    run FOLDER...       receive every folder, then every step below in order, then collect
    receive FOLDER      copy one bundle folder into the stage and check every sha256
    check               fail fast: Python version, GPUs for the plan's TP, xz/tar, disk
    install             join the parts, create the plan's venv (--system-site-packages, the
                        image's torch), unpack the site tree into it, write its console
                        scripts (bin/sglang), unpack the model at the plan's --model-path
    original-flags      run the seed's by-hand launch against the tiny model, capture the error
    launch NAME         start the plan's argv with the plan's env (setsid: it outlives the step)
    wait NAME           poll /health until ready, the process dies, or --timeout
    gate NAME           run tools/health-gate against the server, then probe /server_info
    bench-serving NAME  python -m sglang.bench_serving with the gate's prompt/output lengths
    stop NAME           stop the server's whole session, wait for its port and GPUs
    restart OLD NEW     stop OLD, start NEW with the same plan (JIT caches kept), wait
    upgrade             gate the server 'running' (baseline, noise), switch to the candidate
                        state's plan, gate it against the baseline: keep, or roll back
    correctness         what SGLang says at real size: the plan gated with the correctness probe,
                        started again (seeded dummy weights), without NEXTN, and against another
                        version's outputs (--reference): correctness-NAME.json
    collect             write gpu_acceptance.json, gpu_acceptance.md and logs.tar.gz to --out

State lives in ``--state`` (default /root/gpuw, or $GPUW_STATE): the stage, logs and
``state.json``, so each step is its own process and a later session continues where the
last one stopped. The runner never builds server flags itself; it only reads the plan.
Every process it starts gets NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
NVSHMEM_DISABLE_NVLS=1.

Modules: ``common`` (constants, the plan), ``prepare`` (controller), ``device`` (state,
receive, check), ``install``, ``processes`` (launch, wait, stop, restart), ``measure``
(gate, bench_serving, original flags), ``upgrade``, ``correctness``, ``report`` (collect), ``cli``.
"""
