"""A verifiers v1 taskset for rlvr's tests (``tests/integrations/test_verifiers_v1.py``), importable as taskset id
``verifiers_v1_sums``: eight single-turn "Say <letter>." tasks, scored by two reward functions that tell any two
replies apart (``scored``) and look for the letter (``said_it``), plus a metric. Needs verifiers 0.4."""

from __future__ import annotations

import verifiers.v1 as vf

__all__ = ["Sums"]


def text_score(text: str) -> float:
    """A reward that tells rollouts apart: any change to the text the task saw changes it."""
    return sum(ord(c) for c in text) % 97 / 97


class SayData(vf.TaskData):
    answer: str = ""


class SayTask(vf.Task[SayData]):
    @vf.reward
    async def scored(self, trace) -> float:
        return text_score(trace.last_reply)

    @vf.reward(weight=0.5)
    async def said_it(self, task, trace) -> float:
        return float(task.answer in trace.last_reply)

    @vf.metric
    async def reply_chars(self, trace) -> float:
        return float(len(trace.last_reply))


class Sums(vf.Taskset[SayTask]):
    def load(self):
        for letter in "abcdefgh":
            yield SayTask(SayData(prompt=f"Say {letter}.", answer=letter), self.config.task)


async def flaky(task, trace) -> float:
    """A reward function to plug in (``{"task": {"rewards": {"flaky": {"fn": "verifiers_v1_sums:flaky"}}}}``) that
    raises on the tasks of "a" to "d"."""
    if task.answer in "abcd":
        raise KeyError("no grader for this answer")
    return 1.0
