#!/usr/bin/env bash
# The GPU card's figures in one device command, most wanted first, each bounded by a deadline
# so that the command returns inside its lease (cards/gpu.md says what each measures).
# Run in the project root on the GPU machine, with .whl/ and .gpudata/ carried
# (../shared/gpu/README.md):
#   bash cards/gpu/figures.sh [SECONDS]     # results in $OUT/results.tgz, log in $OUT/log.txt
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
# Every recompile is logged with its reason (a compiled step should have none after warm-up).
export TORCH_LOGS=${TORCH_LOGS-recompiles}
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

# The benchmarks beside bertkit (benchmarks/), run from the repository root.
BK="python3 -m"
BASE="corpus=wikitext2 model=$MODEL trainer.dataloader_num_workers=auto logger=none"
P128="benchmarks.pretrain_throughput $BASE bench.batch_size=256 bench.steps=50 bench.repeats=1"
GLUE="benchmarks.glue_padding model=$MODEL model.tokenizer=.gpudata/vocab/bert-base-uncased bench.batch_size=32 bench.steps=100 logger=none"
MRPC="task=mrpc task.data_dir=.gpudata/glue/MRPC"
SST2="task=sst2 task.data_dir=.gpudata/glue/SST-2"
# Compiled runs: no untimed warm-up run (the steady figures leave out the first steps, where
# the compile happens; the whole-run figures keep it, as a first run of a grid pays it).
COMPILED="trainer.torch_compile=true bench.warmup_steps=0 bench.repeats=1"
GRAPHS="$COMPILED trainer.torch_compile_mode=reduce-overhead"
# max-autotune: Inductor also times GEMM kernels per shape (longer compile), and records CUDA graphs.
AUTOTUNE="$COMPILED trainer.torch_compile_mode=max-autotune"

# 1. GLUE finetuning at batch 32: eager, compiled, compiled with CUDA graphs (both ways alike).
step glue_mrpc_eager 45 $BK $GLUE $MRPC bench.repeats=2 $EXTRA hydra.run.dir=/tmp/runs/glue_mrpc_eager
step glue_mrpc_cudagraphs 100 $BK $GLUE $MRPC $GRAPHS $EXTRA hydra.run.dir=/tmp/runs/glue_mrpc_cudagraphs
step glue_mrpc_compiled 100 $BK $GLUE $MRPC $COMPILED $EXTRA hydra.run.dir=/tmp/runs/glue_mrpc_compiled
step glue_sst2_eager 60 $BK $GLUE $SST2 bench.repeats=2 $EXTRA hydra.run.dir=/tmp/runs/glue_sst2_eager
step glue_sst2_cudagraphs 100 $BK $GLUE $SST2 $GRAPHS $EXTRA hydra.run.dir=/tmp/runs/glue_sst2_cudagraphs
# 2. Pretraining at 128 tokens, batch 256, compiled with CUDA graphs (padding-free is not on main;
# the vocabulary padded to 30,528 rows, bertkit's default).
step pretrain128_cudagraphs 110 $BK $P128 $GRAPHS $EXTRA hydra.run.dir=/tmp/runs/pretrain128_cudagraphs
# 3. The same with max-autotune (its compile is not yet measured: the estimate is a guess), and
# with CUDA graphs but the vocabulary unpadded (bertkit pads it to a multiple of 64 by default).
step pretrain128_autotune 300 $BK $P128 $AUTOTUNE $EXTRA hydra.run.dir=/tmp/runs/pretrain128_autotune
step pretrain128_cudagraphs_vocab_unpadded 110 $BK $P128 $GRAPHS pretraining.pad_vocab_to_multiple_of=1 \
  $EXTRA hydra.run.dir=/tmp/runs/pretrain128_cudagraphs_vocab_unpadded
# 4. The profiles of the compiled GLUE step and the compiled pretraining step (default mode:
# its kernels stay visible one by one).
step profile_glue 60 python3 cards/gpu/profile_step.py "$RES/profile_glue_mrpc_compiled.txt" \
  $GLUE $MRPC bench.steps=14 trainer.torch_compile=true $EXTRA
step profile_pretrain 60 python3 cards/gpu/profile_step.py "$RES/profile_pretrain128_compiled.txt" \
  $BASE bench.batch_size=256 bench.steps=14 trainer.torch_compile=true $EXTRA
step glue_sst2_compiled 100 $BK $GLUE $SST2 $COMPILED $EXTRA hydra.run.dir=/tmp/runs/glue_sst2_compiled
echo "== done after $(($(date +%s) - START)) s" | tee -a "$LOG"
pack
