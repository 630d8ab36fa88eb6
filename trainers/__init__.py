"""Trainers: the single-machine GRPO-RoC trainer and the OpenRLHF integration."""
