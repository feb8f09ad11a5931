"""The benchmark jobs (recipe.job bench_*), one module each: its workload, and calls to the
core they share: measure (clocks, counters and the figures made of them), side_by_side (how ways
run in one process), report (the result JSON and its table). Sits above the families and may
import them."""
