"""`invoke recipes`: the recipes, each with the one line that says when to pick it."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from dockyard.settings import Settings


def print_table(settings: Settings) -> None:
    from dockyard.train.recipe import list_recipes

    table = Table(title="recipes (invoke run --recipe=NAME)", show_lines=False)
    table.add_column("recipe", style="bold")
    table.add_column("when to pick it")
    for r in list_recipes():
        table.add_row(r.name, r.when)
    Console().print(table)
