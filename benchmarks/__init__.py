"""bertkit's benchmarks, beside the library: each module measures bertkit against the plain
Hugging Face way, and runs as a command, `python -m benchmarks.<module> [overrides]` from the
repository's root (the Makefile's bench-* targets), on its YAML in benchmarks/conf/.

They use bertkit as any user code does; bertkit knows nothing of them. The core they share:
measure (clocks, counters and the figures made of them), side_by_side (how ways run in one
process), report (the result JSON and its table), settings (their settings' ranges), command
(composing and running one)."""
