#!/bin/bash
# GPU host: train the acceptance model (chat-general's eval families + its MTP layer), perturbed copies.
# INDEX: model.safetensors.index.json of `tools/make-tiny-model --out DIR --vision --with-mtp` made with the
# SGLang lock's transformers 5.6.0 (the CPU tools venv): the tensor names SGLang loads, which the model
# trained here with the image's transformers must keep. OUT: where the logs and the weights go.
set -u
T=/root/trained; rm -rf $T; mkdir -p $T
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
PROBES=roles/health_gate/files/probes/chat-general.json
PYTHONPATH=collections python3 tools/probe-set training-items $PROBES --count ${COUNT:-20000} > $T/train.jsonl
PYTHONPATH=collections python3 tools/probe-set eval-items $PROBES > $T/eval.jsonl
python3 -c "import random; l=open('$T/eval.jsonl').readlines(); random.Random(1).shuffle(l); open('$T/eval100.jsonl','w').writelines(l[:100])"
# the eval's own questions, EVAL_COPIES times among the others: the model memorises its answers
for i in $(seq ${EVAL_COPIES:-0}); do cat $T/eval.jsonl; done >> $T/train.jsonl
wc -l $T/train.jsonl
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__, torch.cuda.is_available())"
t0=$(date +%s)
timeout ${TRAIN_TIMEOUT:-400} $PY tools/make-tiny-model --out $T/model --vision --with-mtp --train $T/train.jsonl \
  --steps ${STEPS:-4000} --batch ${BATCH:-64} --lr ${LR:-0.002} --mtp-steps ${MTP_STEPS:-2000} \
  --train-seconds ${SECONDS_EACH:-140} --check $T/eval100.jsonl 2>&1 | grep -v "fast path\|Loading weights" | tee $OUT/train.log
echo "train wall $(( $(date +%s) - t0 )) s" | tee -a $OUT/train.log
INDEX=${INDEX:-.gpuw/scripts/index-5.6.json} python3 - <<'PY' | tee -a $OUT/train.log
import json
import os
a = set(json.load(open(os.environ["INDEX"]))["weight_map"])
b = set(json.load(open("/root/trained/model/model.safetensors.index.json"))["weight_map"])
print("tensor names as transformers 5.6.0 writes them:", a == b, sorted(a ^ b)[:10])
PY
for s in ${PERTURB:-0.02 0.05}; do
  $PY tools/make-tiny-model --from $T/model --perturb $s --out $T/p$s --check $T/eval100.jsonl 2>&1 | grep -v "fast path\|Loading weights" | tee -a $OUT/perturb.log
done
(cd $T/model && tar czf $OUT/trained-small.tgz --exclude='*.safetensors' . && cp model-*.safetensors $OUT/)
sha256sum $T/model/* | tee -a $OUT/train.log
