"""GRPO-RoC on OpenRLHF."""
