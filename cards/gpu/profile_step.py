"""One torch.profiler trace of bertkit's training steps, to see what bounds a step: the bertkit
way of bench_pretrain (the default) or of bench_glue (`recipe=bench_glue` first among the
overrides: benchmarks/conf/bench_glue.yaml). How the profiles beside it were taken
(cards/gpu.md), on the GPU machine:
    python3 cards/gpu/profile_step.py OUTFILE corpus=wikitext2 model=scratch_base \
        bench.batch_size=256 bench.steps=14
    python3 cards/gpu/profile_step.py OUTFILE recipe=bench_glue task=mrpc \
        task.data_dir=.gpudata/glue/MRPC model=scratch_base bench.steps=14 \
        trainer.torch_compile=true
Steps 9-13 are recorded (5 skipped, 3 warm-up). Besides torch's tables, the file opens with a
summary per recorded step: host time, GPU span and kernel time, kernel launches and
CUDA-graph replays."""
import sys
from pathlib import Path

from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, schedule
from transformers import TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, beside bertkit
from benchmarks.command import compose_config  # noqa: E402

WAIT, WARMUP, ACTIVE = 5, 3, 5
# Runtime and driver calls that start one kernel, or replay a whole recorded graph.
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
GRAPH_LAUNCHES = ("cudaGraphLaunch",)

out, overrides = Path(sys.argv[1]), sys.argv[2:]
recipe = next((item.split("=", 1)[1] for item in overrides if item.startswith("recipe=")),
              "bench_pretrain")
cfg = compose_config(recipe, [item for item in overrides if not item.startswith("recipe=")])
run_dir = Path("/tmp/profile_step")
steps = int(cfg.bench.steps)
if recipe == "bench_glue":
    from benchmarks import glue_padding as glue

    tokenizer, train, build_model = glue.prepare(cfg.task, cfg.model, cfg.data_source,
                                                 cfg.cache_dir, cfg.preprocessing_num_workers)
    job = glue.padding_job(cfg)
    probe = glue.build_training_arguments(job.arguments, run_dir, [])
    precision = "bf16" if probe.bf16 else "fp16" if probe.fp16 else "fp32"
    trainer, model, _ = glue.build_trainer(
        job, "bertkit", steps, run_dir, build_model, train,
        glue.collator(job, tokenizer, "bertkit", precision), tokenizer)
else:
    from benchmarks import pretrain_throughput as bench

    job = bench.throughput_job(cfg)
    data = bench._prepare(job, run_dir, steps)
    args = bench._arguments(job, "bertkit", steps, run_dir)
    indices = bench.training_indices(len(data.prepared.train_dataset),
                                     steps * args.per_device_train_batch_size, args.seed)
    trainer, model = bench._trainer(job, "bertkit", args, data, indices,
                                    data.prepared.collator)
profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                   schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1))


class StepProfiler(TrainerCallback):
    def on_step_end(self, *args, **kwargs):
        profiler.step()


trainer.add_callback(StepProfiler())
with profiler:
    trainer.train()
averages = profiler.key_averages()


def per_step(names) -> float:
    return sum(event.count for event in averages if event.key in names) / ACTIVE


def device_us(event) -> float:
    return (getattr(event, "self_device_time_total", None)
            or getattr(event, "self_cuda_time_total", 0))


# ProfilerStep appears twice: on the host (the step's CPU time) and as a user annotation on the
# GPU (the step's span there); annotations are left out of kernel time, as torch's table does.
host_steps = [event for event in averages
              if event.key.startswith("ProfilerStep") and event.device_type == DeviceType.CPU]
gpu_steps = [event for event in averages
             if event.key.startswith("ProfilerStep") and event.device_type != DeviceType.CPU]
host_ms = (sum(event.cpu_time_total for event in host_steps) / 1e3
           / max(sum(event.count for event in host_steps), 1))
span_ms = (sum(event.device_time_total for event in gpu_steps) / 1e3
           / max(sum(event.count for event in gpu_steps), 1))
kernel_ms = sum(device_us(event) for event in averages
                if event.device_type == DeviceType.CUDA
                and not event.is_user_annotation) / 1e3 / ACTIVE
summary = (f"{recipe} attn={model.config._attn_implementation} steps={steps} "
           f"compile={cfg.trainer.torch_compile} mode={cfg.trainer.torch_compile_mode}\n"
           f"per recorded step: host time {host_ms:.1f} ms (ProfilerStep CPU total), "
           f"GPU span {span_ms:.1f} ms, kernel time {kernel_ms:.1f} ms, "
           f"kernel launches {per_step(LAUNCHES):.0f}, "
           f"CUDA-graph replays {per_step(GRAPH_LAUNCHES):.0f}")
text = [summary,
        averages.table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70),
        averages.table(sort_by="cpu_time_total", row_limit=15, max_name_column_width=70)]
out.write_text("\n\n".join(text))
print("\n\n".join(text))
