"""Verification beside the product: the engine cross-check (verify/crosscheck.py) and the stage step-check
(verify/stepcheck.py) that the tests, the compatibility matrix and the legacy-DeepSpeed job run.

These harnesses import the product and build every run with the same `pipeline.build_run` that `loraflow train`
calls; no module of the product imports this package (a test holds the import graph to it).
"""
