"""Typed configuration: schema (dataclasses), loader (YAML + overrides), docs (field reference)."""

from loraflow.config.loader import config_to_dict, dump_config, load_config, parse_overrides
from loraflow.config.schema import Config

__all__ = ["Config", "load_config", "parse_overrides", "config_to_dict", "dump_config"]
