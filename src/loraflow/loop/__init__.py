"""The training loop shared by every stage and engine (trainer.py) and what runs inside it: log-probs of the
learned tokens, the mode of each phase, guards, the divergence watch, evaluation, metrics and the memory report."""
