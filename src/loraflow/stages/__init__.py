"""One module per stage, each a thin layer over the shared trainer: its loss function and its evaluation."""
