"""Synthetic tasks: bounded Dyck-k with WCPA, reverse copy, partial-sentence training."""
