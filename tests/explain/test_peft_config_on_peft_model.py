"""explain names TRL's own refusal of a PeftModel given with a peft_config (trl >= 0.27, PR #4713)."""

from __future__ import annotations

from loraflow.explain import diagnose_log

# The shape of the traceback TRL 0.27+ prints (trl/trainer/sft_trainer.py __init__).
LOG = """Traceback (most recent call last):
  File "/home/u/train.py", line 41, in <module>
    trainer = SFTTrainer(
  File "/opt/conda/lib/python3.11/site-packages/trl/trainer/sft_trainer.py", line 702, in __init__
    raise ValueError(
ValueError: You passed a `PeftModel` instance together with a `peft_config` to the trainer. Please first merge and \
unload the existing adapter, save the resulting base model, and then pass that base model along with the new \
`peft_config` to the trainer.
"""


def test_trl_s_refusal_is_named():
    _, candidates, _ = diagnose_log(LOG, None)
    assert candidates and candidates[0].rule.id == "peft-config-on-peft-model"
    assert candidates[0].confidence == "confirmed"
