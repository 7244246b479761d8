"""Autotuning on a target: build and measure candidates (executors, timing), the tuning loop (`autotune`, also
exported as `codegen.autotune`) and the `loopir` command."""
