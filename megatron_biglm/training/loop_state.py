"""Where the loop is (step, samples, tokens), and how it goes into and out of a checkpoint.

Every stateful piece of a run saves and restores itself (`state_dict`/`load_state_dict`,
like torch modules); the checkpoint's train state is assembled from them, so adding a
stateful piece (a guard, a recipe's curriculum) adds one name, not hand-copied fields.
The loop's own fields stay at the top level of train_state.json, where checkpoints have
always kept them (and where export and resume checks read `iteration`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class LoopState:
    iteration: int = 0
    consumed_samples: int = 0
    consumed_tokens: int = 0
    last_loss: float = math.nan
    last_val_loss: float | None = None
    first_val_loss: float | None = None
    stopped_by: str | None = None
    stop_requested: str | None = None  # a callback's reason to end the run early (saved, like a signal)
    losses: list = field(default_factory=list)
    tokens_per_sample: int = 0  # for checkpoints written before consumed_tokens was saved

    def state_dict(self) -> dict:
        """What a resume needs (the rest describes this process's run only)."""
        return {"iteration": self.iteration, "consumed_samples": self.consumed_samples,
                "consumed_tokens": self.consumed_tokens}

    def load_state_dict(self, state: dict) -> None:
        self.iteration = int(state["iteration"])
        self.consumed_samples = int(state["consumed_samples"])
        self.consumed_tokens = int(state.get("consumed_tokens", self.consumed_samples * self.tokens_per_sample))


def checkpoint_state(loop_state: LoopState, stateful: dict) -> dict:
    """The train state to save: the loop's fields, then each `name: obj.state_dict()`
    (an object with nothing to save, `{}`, is left out)."""
    out = loop_state.state_dict()
    for name, obj in stateful.items():
        state = obj.state_dict()
        if state:
            out[name] = state
    return out


def restore_state(saved: dict, loop_state: LoopState, stateful: dict) -> None:
    """Hand each piece its part of a loaded train state (`{}` where it saved nothing)."""
    loop_state.load_state_dict(saved)
    for name, obj in stateful.items():
        obj.load_state_dict(saved.get(name, {}))
