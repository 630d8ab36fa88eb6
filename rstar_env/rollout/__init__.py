"""Policies and trajectory collection."""
