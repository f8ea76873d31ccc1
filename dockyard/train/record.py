"""What one trainer process knows about its run, part by part as each step of dockyard.train gives it: the
manifest is written from it (dockyard.train.ending), also when a run fails half-way, recording how far it got."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from dockyard.common import runfolder
from dockyard.common.recipes import Recipe


@dataclass
class ModelRecord:
    """The manifest's `model`: the base the run started from, its size, and what the run saves."""

    base: str
    parameters: int | None               # None: the model could not be sized
    format: str                          # "adapter" (LoRA/QLoRA: the adapter alone is saved) or "full"
    footprint_bytes: int | None = None   # the base's weights as loaded: known once the model is loaded
    quantized_layers: int | None = None  # QLoRA: the linear layers really held in 4 bits

    def to_json(self) -> dict[str, Any]:
        return {"base": self.base, "parameters": self.parameters, "saved": runfolder.MODEL, "format": self.format,
                **({"footprint_bytes": self.footprint_bytes} if self.footprint_bytes is not None else {}),
                **({"quantized_layers": self.quantized_layers} if self.quantized_layers is not None else {})}


@dataclass(frozen=True)
class Estimates:
    """`invoke plan`'s figures for this run, beside what it measures: the GPU peak (dockyard.common.memory) and what
    it writes to disk (dockyard.common.disk, said again if a save runs out of space). Each an error when it cannot
    be made: only a record."""

    plan: dict[str, Any]
    disk: dict[str, Any]


@dataclass
class Record:
    """What the manifest says beyond manifest.build's own keys, filled in as each step gives its part: a run that
    fails half-way records the parts it got to. to_json keeps the manifest's order of keys."""

    recipe_files: dict[str, Any] | None = None
    sizing_error: str | None = None              # the model could not be sized: the manifest's `plan` says why
    model: ModelRecord | None = None
    task: str | None = None
    overrides: dict[str, Any] | None = None      # the settings given after `--` (--resume: the run's, updated)
    resumed: dict[str, Any] | None = None        # --resume: the checkpoint this attempt continued from, and how
    settings_resolved: dict[str, dict[str, Any]] | None = None  # what each `auto` setting became, and why
    nodes_seen: list[dict[str, Any]] | None = None  # several nodes: who checked the run folder is shared
    inputs: dict[str, Any] | None = None         # model and data paths, host and inside, fingerprinted
    data: dict[str, Any] | None = None           # data.load's account: format, examples, tokens, cut, ...
    estimates: Estimates | None = None
    reference_logits: dict[str, Any] | None = None  # the manifest's `probe`: see reference_logits()
    profile: dict[str, Any] | None = None        # profile_steps: what the profiler found (rank 0's)

    def to_json(self) -> dict[str, Any]:
        parts = [("recipe_files", self.recipe_files),
                 ("plan", {"error": self.sizing_error} if self.sizing_error else None),
                 ("model", self.model.to_json() if self.model else None),
                 ("task", self.task),
                 ("overrides", self.overrides),
                 ("resumed", self.resumed),
                 ("settings_resolved", self.settings_resolved),
                 ("nodes_seen", self.nodes_seen),
                 ("inputs", self.inputs),
                 ("data", self.data),
                 ("plan", self.estimates.plan if self.estimates else None),
                 ("disk", self.estimates.disk if self.estimates else None),
                 ("probe", self.reference_logits),
                 ("profile", self.profile)]
        return {key: value for key, value in parts if value is not None}


@dataclass
class Run:
    """What this process knows about its run so far: the manifest is written from it, also when a run fails
    half-way (it then records how far it got)."""

    opts: argparse.Namespace
    started: float
    is_main: bool                      # rank 0 alone writes the manifest
    status: str = "failed"
    recipe: Recipe | None = None
    run_dir_ok: bool = False           # the folder is this run's: only then is a manifest written there
    manifest_found: bool = False       # the folder held this node's manifest already (a run resumed)...
    training: bool = False             # ...which is replaced only once this attempt starts training
    world_size: int = 1
    check: Any = None                  # the strategy check, once the Trainer exists
    metrics: dict[str, Any] = field(default_factory=dict)
    log: Any = None                    # callbacks.MetricsLog, once the Trainer exists: what a stopped run measured
    record: Record = field(default_factory=Record)
    heartbeat: Any = None              # several nodes: nodes.Heartbeat, which also says what this node is doing
    finished: bool = False             # the manifest is written (by the main thread, or by the heartbeat's)
    error: str | None = None           # the error as finish recorded it: a lost node named first, where one was
    unusable_caches: list[str] = field(default_factory=list)  # compile cache folders not used, and why
    training_lock: int | None = None     # the run folder's lock this process holds (runfolder.hold)
    overrides: dict[str, Any] = field(default_factory=dict)   # the settings given after `--`, a resume's merged in
    kept_overrides: dict[str, Any] = field(default_factory=dict)  # --resume: those of the run's that it keeps
    same_everywhere: bool = True  # its errors so far come of what every process reads alike: the command line, the
                                  # recipe and settings, the run folder (said by one process per node)

    phase: str = ""               # what this process is doing (doing())

    def doing(self, phase: str) -> None:
        """What this node is doing, for the message that names a node lost meanwhile and for rank 0's line after a
        silence (logs.Quiet)."""
        self.phase = phase
        if self.heartbeat:
            self.heartbeat.phase = phase
