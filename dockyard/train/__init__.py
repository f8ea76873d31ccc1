"""The image side: the trainer `invoke run` starts in the container (`python -m dockyard.train`).

Needs the training stack (torch, transformers, DeepSpeed, PEFT); the host side of the project never imports
it, except recipe.py, which reads recipes with pydantic and PyYAML alone.
"""
