"""Single-machine GRPO-RoC trainer."""
