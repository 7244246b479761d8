"""Autotuning: search spaces from the schedule rules, search strategies and the trial database (the measuring
executors and `autotune` itself are in codegen.tune, which may build)."""
