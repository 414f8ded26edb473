"""A multi-turn verifiers v1 env for rlvr's tests (``tests/integrations/test_verifiers_v1.py``), taskset id
``verifiers_v1_again``: the env answers each of the model's replies with the user turn "Again." until the model has
answered three times; the reward is the share of those three answers the trace holds. Needs verifiers 0.4."""

from __future__ import annotations

import verifiers.v1 as vf

__all__ = ["Again", "AgainEnv"]

TURNS = 3


class AgainTask(vf.Task[vf.TaskData]):
    @vf.reward
    async def answered(self, trace) -> float:
        return sum(node.sampled for node in trace.nodes) / TURNS


class Again(vf.Taskset[AgainTask]):
    def load(self):
        for word in ("one", "two", "three", "four"):
            yield AgainTask(vf.TaskData(prompt=f"Count from {word}."), self.config.task)


class AgainEnv(vf.SingleAgentEnv):
    async def run(self, task, agents):
        async with agents.agent.interaction(task) as chat:
            segment = await chat.turn()
            for _ in range(TURNS - 1):
                if segment.terminated:
                    return
                segment = await chat.turn("Again.")
