"""Verification beside the product: the engine cross-check (crosscheck.py), the stage step-check (stepcheck.py),
the composition sweep (sweep_*.py), the device check (device*.py) and the side environments they run in
(side_envs.py), which the tests, scripts/ and the legacy-DeepSpeed job run from a clone.

These harnesses import the product and build every run with the same `run.pipeline.build_run` that `loraflow train`
calls; no module of the product imports this package (a test holds the import graph to it). It ships in the wheel
all the same: the device check (scripts/gpu_check.sh) installs loraflow's wheel on a bare GPU machine and runs
devicecheck from it, which proves the wheel as users get it, not a clone.
"""
