"""An image-text model's processor (tokenizer + image processor + chat template).

transformers builds every part a processor class declares, a video processor too, even for image-only training;
Qwen2-VL's, Qwen2.5-VL's and LLaVA-OneVision's video processors need torchvision, which a CPU stack often lacks
(its PyPI builds do not load with CPU torch), and AutoProcessor then fails. loraflow reads images only: where the
video part is all that cannot be built, it loads the same processor class without it, says so, and keeps the
checkpoint's video processor config beside every processor it saves, so a stack with torchvision loads that saved
processor whole.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

import torch

from loraflow.config.schema import Config
from loraflow.errors import ConfigError
from loraflow.setup.model import _first_line
from loraflow.locations import location_of
from loraflow.setup.paths import quiet

log = logging.getLogger("loraflow")

VIDEO_CONFIG = "video_preprocessor_config.json"
VIDEO_PART = "video_processor"


def load_processor(config: Config, model_path: str):
    """The processor from model.tokenizer or the model's directory; its tokenizer gets a pad token as
    load_tokenizer's does."""
    spec = config.model.tokenizer
    path = location_of(spec, "model.tokenizer") if spec else model_path
    return processor_at(path, config.model.trust_remote_code)


def processor_at(path: str, trust: bool = False):
    """The image-text processor saved at `path` (a run's adapter directory, a merged model, a base), loaded as
    training loads it: without its video part where only that part cannot be built here."""
    from transformers import AutoProcessor

    try:
        with quiet():  # image processors without torchvision say they fall back to PIL: expected on a CPU stack
            processor = AutoProcessor.from_pretrained(path, trust_remote_code=trust)
    except (ImportError, OSError, ValueError) as exc:
        processor = _without_video(path, trust, exc)
        if not hasattr(processor, "image_processor"):  # None, or the error that blocks the image parts too
            raise _load_error(path, processor or exc) from None
    if not hasattr(processor, "tokenizer") or not hasattr(processor, "image_processor"):
        raise ConfigError([f"{path} holds a {type(processor).__name__}, not an image-text processor (a tokenizer and "
                           "an image processor); set model.tokenizer to the model's processor."])
    if processor.tokenizer.pad_token is None:
        processor.tokenizer.pad_token = processor.tokenizer.eos_token
    return processor


PACKAGE_NAMED = re.compile(r"requires the (\S+) library|Package `([^`]+)` is required|No module named '([^'.]+)")
"""How transformers' import errors name the missing package."""


def _load_error(path: str, exc: BaseException) -> ConfigError:
    said = _first_line(exc)
    if isinstance(exc, ImportError):
        found = PACKAGE_NAMED.search(" ".join(str(exc).split()))
        package = next((g for g in found.groups() if g), None) if found else None
        return ConfigError([f"cannot load the image-text processor at {path}: transformers needs "
                            f"{package.lower() if package else 'a package that is not installed'} to build "
                            f"it ({said.rstrip('.')}). Install it (built for this torch {torch.__version__})."])
    return ConfigError([f"cannot load an image-text processor from {path} ({said}). An image-text model needs its "
                        "processor (preprocessor_config.json beside the tokenizer); set model.tokenizer to a "
                        "directory or hub id that has one."])


def _processor_class(path: str, trust: bool):
    """The processor class AutoProcessor would build for `path` (processor_config.json, a legacy
    preprocessor_config.json, else the model config's type), or None."""
    from transformers import AutoConfig
    from transformers.image_processing_base import ImageProcessingMixin
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING, processor_class_from_name
    from transformers.processing_utils import ProcessorMixin

    try:
        name = (ProcessorMixin.get_processor_dict(path)[0].get("processor_class")
                or ImageProcessingMixin.get_image_processor_dict(path)[0].get("processor_class"))
        if name:
            return processor_class_from_name(name)
        return PROCESSOR_MAPPING.get(type(AutoConfig.from_pretrained(path, trust_remote_code=trust)))
    except (ImportError, OSError, ValueError, KeyError):  # a class that cannot even be imported here
        return None


def _without_video(path: str, trust: bool, exc: BaseException):
    """The processor without its video part, where that part is what failed to build; else None, or the
    ImportError that blocks its image parts too (SmolVLM's needs num2words)."""
    cls = _processor_class(path, trust)
    try:
        if cls is None or VIDEO_PART not in cls.get_attributes():
            return None
    except ImportError:  # a stand-in for a class whose module needs a missing package (Pixtral's: torchvision)
        return None
    try:
        with quiet():  # video_processor=None: some (SmolVLM's) take it as a required argument
            processor = image_only(cls).from_pretrained(path, trust_remote_code=trust, video_processor=None)
    except ImportError as blocked:
        return blocked
    except (OSError, ValueError, TypeError):
        return None
    processor.video_source = Path(path)
    log.info("%s: %s loaded without its video processor (%s); loraflow reads images only", path, cls.__name__,
             _first_line(exc))
    return processor


def image_only(cls):
    """`cls` without its video part. ProcessorMixin builds, checks and saves the parts get_attributes() names (the
    __init__ arguments named after a modality); every transformers processor with a video part passes it to
    ProcessorMixin.__init__ after the image processor and tokenizer, where a shorter attribute list drops it.
    __init__ is the class's own, so its other settings (image token counts) still load and save, and the class
    keeps its name, so processor_config.json names the real processor."""

    class ImageOnly(cls):
        @classmethod
        def get_attributes(klass):
            return [a for a in super().get_attributes() if a != VIDEO_PART]

        def save_pretrained(self, save_directory, *args, **kwargs):
            out = super().save_pretrained(save_directory, *args, **kwargs)
            source = getattr(self, "video_source", None)
            if source is not None and (source / VIDEO_CONFIG).is_file():
                shutil.copy(source / VIDEO_CONFIG, Path(save_directory) / VIDEO_CONFIG)
            return out

    ImageOnly.__name__ = ImageOnly.__qualname__ = cls.__name__
    ImageOnly.__module__ = cls.__module__
    return ImageOnly
