#!/bin/bash
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
V=${V:-0511}
GA="python3 tools/gpu-acceptance --state /root/gpuw/v$V"
t0=$(date +%s)
$GA receive .gpuw/a$V/${LAST:-4} && $GA check && $GA install 2>&1 | tail -5 || exit 1
M=/root/models/tiny-qwen3.6/trained
rm -rf $M && cp -r ${TRAINED:-/root/trained/model} $M && sha256sum $M/model-*.safetensors
VPY=$(ls -d /root/ml-env.d/*/bin/python | head -1)
for s in ${PERTURB:-0.3 0.5}; do
  rm -rf /root/models/tiny-qwen3.6/p$s; $VPY tools/make-tiny-model --from $M --perturb $s --out /root/models/tiny-qwen3.6/p$s | tail -1
done
echo "install wall $(( $(date +%s) - t0 )) s"
