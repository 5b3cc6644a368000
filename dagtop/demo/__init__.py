"""A real CPU DDP job (gloo) whose bottleneck can be chosen, and the launcher that runs it rank by rank."""
