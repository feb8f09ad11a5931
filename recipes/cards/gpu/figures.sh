#!/usr/bin/env bash
# The GPU card's figures in one device command, most wanted first, each bounded by a deadline
# so that the command returns inside its lease (recipes/cards/gpu.md says what each measures).
# Run in the project root on the GPU machine, with .whl/ and .gpudata/ carried
# (../shared/gpu/README.md):
#   bash recipes/cards/gpu/figures.sh [SECONDS]     # results in $OUT/results.tgz, log in $OUT/log.txt
# A step starts only while its estimate fits in what is left of SECONDS (default 570).
set -u
LIMIT=${1:-570}
START=$(date +%s)
OUT=${OUT:-/tmp/out}
RES=/tmp/res
mkdir -p "$OUT" "$RES"
LOG="$OUT/log.txt"
# Tried on a CPU machine whose python3 has bertkit installed:
#   MODEL=scratch_tiny NO_WHEELS=1 EXTRA="bench.steps=12 bench.batch_size=16 bench.repeats=1" bash ...
MODEL=${MODEL:-scratch_base}
EXTRA=${EXTRA:-}
[ -n "${NO_WHEELS:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile \
  --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >>"$LOG" 2>&1 \
  || { echo "wheels failed" | tee -a "$LOG"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 BERTKIT_DATA=$PWD/.gpudata WANDB_MODE=disabled
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
  nproc
  python3 -c "import torch, transformers, datasets, hydra, bertkit; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'datasets', datasets.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
} >"$RES/versions.txt" 2>&1 || { cat "$RES/versions.txt" | tee -a "$LOG"; exit 1; }
cat "$RES/versions.txt" >>"$LOG"

pack() { tar -czf "$OUT/results.tgz" -C "$RES" . 2>/dev/null; }

# step NAME ESTIMATE_SECONDS COMMAND...: runs COMMAND if ESTIMATE fits, bounded by the deadline.
step() {
  local name=$1 estimate=$2; shift 2
  # ONLY="name ...": run just these steps (a rerun of some).
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  local left=$((START + LIMIT - $(date +%s)))
  if [ "$left" -lt "$estimate" ]; then
    echo "== $name: skipped ($left s left, needs ~$estimate)" | tee -a "$LOG"; return
  fi
  echo "== $name ($(date +%T), $left s left): $*" | tee -a "$LOG"
  local began=$(date +%s)
  local cap=$((2 * estimate < left ? 2 * estimate : left))  # a stuck step leaves the others time
  timeout "$cap" "$@" >"$RES/$name.log" 2>&1
  echo "== $name: exit $? after $(($(date +%s) - began)) s" | tee -a "$LOG"
  grep -v "^\s*$" "$RES/$name.log" | grep -E "^\||^ +(way|plain|bertkit) |ratio|after the first|worker|Error|error" \
    | tail -20 >>"$LOG"
  for file in /tmp/runs/$name/*.json; do [ -f "$file" ] && cp "$file" "$RES/$name.json"; done
  pack
}

BK="python3 -m bertkit"
BASE="corpus=wikitext2 model=$MODEL trainer.dataloader_num_workers=auto logger=none"
P128="recipe=bench_pretrain $BASE bench.batch_size=256 bench.steps=50 bench.repeats=2"
P512="recipe=bench_pretrain $BASE bench.batch_size=32 bench.steps=50 bench.repeats=2 pretraining.max_seq_length=512"
GLUE="recipe=bench_glue model=$MODEL model.tokenizer=.gpudata/vocab/bert-base-uncased bench.batch_size=32 bench.steps=100 bench.repeats=2 logger=none"

step pretrain128_eager 90 $BK $P128 $EXTRA hydra.run.dir=/tmp/runs/pretrain128_eager
step pretrain128_compiled 150 $BK $P128 trainer.torch_compile=true $EXTRA hydra.run.dir=/tmp/runs/pretrain128_compiled
# The profile of the faster of the two 128-token steps (steady samples/s).
COMPILE=$(python3 - <<'EOF'
import json, pathlib
def steady(name):
    path = pathlib.Path(f"/tmp/res/{name}.json")
    if not path.exists():
        return 0
    return json.loads(path.read_text())["ways"]["bertkit"].get("steady_samples_per_second") or 0
print("true" if steady("pretrain128_compiled") > steady("pretrain128_eager") else "false")
EOF
)
step profile128 60 python3 recipes/cards/gpu/profile_step.py "$RES/profile_step128.txt" \
  $BASE bench.batch_size=256 bench.steps=14 trainer.torch_compile=$COMPILE $EXTRA
step glue_mrpc_eager 60 $BK $GLUE task=mrpc task.data_dir=.gpudata/glue/MRPC $EXTRA hydra.run.dir=/tmp/runs/glue_mrpc_eager
step glue_sst2_eager 60 $BK $GLUE task=sst2 task.data_dir=.gpudata/glue/SST-2 $EXTRA hydra.run.dir=/tmp/runs/glue_sst2_eager
step pretrain512_eager 60 $BK $P512 $EXTRA hydra.run.dir=/tmp/runs/pretrain512_eager
step pretrain128_cudagraphs 120 $BK $P128 trainer.torch_compile=true trainer.torch_compile_mode=reduce-overhead $EXTRA hydra.run.dir=/tmp/runs/pretrain128_cudagraphs
step glue_mrpc_compiled 120 $BK $GLUE task=mrpc task.data_dir=.gpudata/glue/MRPC trainer.torch_compile=true $EXTRA hydra.run.dir=/tmp/runs/glue_mrpc_compiled
step pretrain512_compiled 120 $BK $P512 trainer.torch_compile=true $EXTRA hydra.run.dir=/tmp/runs/pretrain512_compiled
echo "== done after $(($(date +%s) - START)) s" | tee -a "$LOG"
pack
