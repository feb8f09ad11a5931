"""Side-by-side benchmarks against the plain Hugging Face way, in one process, reported as
ratios (make bench-glue, make bench-pretrain-data). Sits above the families and may import them."""
