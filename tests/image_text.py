"""The tests' tiny image-text models and image chat data: the composition sweep's own (loraflow.verify.sweep_vision),
so a family the sweep trains is one the tests can build."""

from loraflow.verify.sweep_vision import (COLOURS, FAMILIES, TEMPLATE, TEXT, _tokenizer,  # noqa: F401
                                          build_image_text, colour_records, write_colour_data)
