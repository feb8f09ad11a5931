"""One torch.profiler trace of bertkit's pretraining steps (bench_pretrain's bertkit way), to
see what bounds a step. How profile_bertkit_step_base128_b256.txt beside it was taken
(recipes/cards/gpu.md), on the GPU machine:
    python3 recipes/cards/gpu/profile_step.py OUTFILE corpus=wikitext2 model=scratch_base \
        bench.batch_size=256 bench.steps=14
Steps 9-13 are recorded (5 skipped, 3 warm-up)."""
import sys
from pathlib import Path

from torch.profiler import ProfilerActivity, profile, schedule
from transformers import TrainerCallback

from bertkit.benchmarks import pretrain_throughput as bench
from bertkit.config_tree import compose_config

out, overrides = Path(sys.argv[1]), sys.argv[2:]
cfg = compose_config(["recipe=bench_pretrain", *overrides])
run_dir = Path("/tmp/profile_step")
steps = int(cfg.bench.steps)
data = bench._prepare(cfg, run_dir, steps)
args = bench._arguments(cfg, "bertkit", steps, run_dir)
indices = bench.training_indices(len(data.prepared.train_dataset),
                                 steps * args.per_device_train_batch_size, args.seed)
trainer, model = bench._trainer(cfg, "bertkit", args, data, indices, data.prepared.collator)
profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                   schedule=schedule(wait=5, warmup=3, active=5, repeat=1))


class StepProfiler(TrainerCallback):
    def on_step_end(self, *args, **kwargs):
        profiler.step()


trainer.add_callback(StepProfiler())
with profiler:
    trainer.train()
averages = profiler.key_averages()
text = [f"attn={model.config._attn_implementation} steps={steps}",
        averages.table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70),
        averages.table(sort_by="cpu_time_total", row_limit=15, max_name_column_width=70)]
out.write_text("\n\n".join(text))
print("\n\n".join(text))
