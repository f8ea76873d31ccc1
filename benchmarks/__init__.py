"""Speed and memory goals, measured side by side in one run: `python -m benchmarks.<name>` from the project root."""
