#!/bin/bash
# GPU host: correctness steps of the trained acceptance model; STEPS_ARGS says which.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
V=${V:-0511}
GA="python3 tools/gpu-acceptance --state /root/gpuw/v$V"
G=(--gate-arg=--warmup=1 --gate-arg=--requests=2 --gate-arg=--max-tokens=32 --gate-arg=--min-eval-score=0.8 --gate-arg=--min-accept-length=${MIN_ACCEPT:-1.5})
t0=$(date +%s)
timeout ${LIMIT:-500} $GA correctness --name t$V --timeout 300 "${G[@]}" "$@" 2>&1 | grep -v falling | tail -${TAILN:-40}
echo "correctness wall $(( $(date +%s) - t0 )) s"
cp /root/gpuw/v$V/correctness-t$V*.json $OUT/ 2>/dev/null
(cd /root/gpuw/v$V && tar czf $OUT/logs-$(date +%H%M%S).tgz logs state.json 2>/dev/null)
ls -la $OUT
