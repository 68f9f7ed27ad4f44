"""loraflow: LoRA/DoRA fine-tuning in which every memory saver composes with every adapter setup."""

__version__ = "0.1.0"
