"""The image side: the trainer `invoke run` starts in the container (`python -m dockyard.train`).

Needs the training stack (torch, transformers, DeepSpeed, PEFT); the host side of the project never imports
it. What it shares with the host lives outside it: the recipe registry (dockyard/recipes.py), the memory
planner (dockyard/machine/plan.py) and DockyardError, all importable without torch.
"""
