"""Resumable checkpoints: written atomically and checked before use (store.py), and the markers and
weight checks that let a checkpoint vouch for itself (integrity.py)."""
