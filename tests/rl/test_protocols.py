"""rl/protocols.py: the in-process clients and the Ray clients both satisfy the protocols the loop is typed against.

Checked twice: ``_statically`` below is type-checked by mypy in CI (``.ci/run`` passes this file to it), which
verifies every member's parameter and return types; the tests check at run time that each protocol member exists
on both class trees with parameters a protocol caller can use (same names, kinds and defaults; extra parameters
optional). The Ray clients import without Ray or a cluster.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any

import pytest

from rlvr.client import SamplingClient, ServiceClient, TrainingClient
from rlvr.distributed.clients import RaySamplingClient, RayServiceClient, RayTrainingClient
from rlvr.distributed.rewards import RayRewardRunner
from rlvr.rewards import RewardRunner
from rlvr.rl.protocols import RewardScorer, SamplingAPI, ServiceAPI, TrainingAPI

PAIRS = [(ServiceAPI, ServiceClient), (ServiceAPI, RayServiceClient), (TrainingAPI, TrainingClient),
         (TrainingAPI, RayTrainingClient), (SamplingAPI, SamplingClient), (SamplingAPI, RaySamplingClient),
         (RewardScorer, RewardRunner), (RewardScorer, RayRewardRunner)]


def _statically(local: tuple[ServiceClient, TrainingClient, SamplingClient, RewardRunner],
                ray: tuple[RayServiceClient, RayTrainingClient, RaySamplingClient, RayRewardRunner]) -> None:
    """Never called: mypy checks that each class is assignable to its protocol."""
    services: list[ServiceAPI] = [local[0], ray[0]]
    trainers: list[TrainingAPI] = [local[1], ray[1]]
    samplers: list[SamplingAPI] = [local[2], ray[2]]
    scorers: list[RewardScorer] = [local[3], ray[3]]
    del services, trainers, samplers, scorers


def members(protocol: type) -> dict[str, Any]:
    """The protocol's members: name -> its function or property (the context-manager methods included)."""
    return {name: value for name, value in vars(protocol).items()
            if (not name.startswith("_") or name in ("__enter__", "__exit__"))
            and (inspect.isfunction(value) or isinstance(value, property))}


def mismatches(protocol: type, cls: type) -> list[str]:
    """What keeps ``cls`` from offering ``protocol``'s members to a caller that knows only the protocol."""
    problems = []
    for name, member in members(protocol).items():
        if isinstance(member, property):  # an attribute: a property on the class, or set in its __init__
            if not (isinstance(getattr(cls, name, None), property)
                    or f"self.{name} =" in inspect.getsource(cls)):
                problems.append(f"{name}: no attribute")
            continue
        implementation = getattr(cls, name, None)
        if not callable(implementation):
            problems.append(f"{name}: missing")
            continue
        wanted = list(inspect.signature(member).parameters.values())[1:]
        offered = dict(list(inspect.signature(implementation).parameters.items())[1:])
        for parameter in wanted:
            given = offered.pop(parameter.name, None)
            if given is None:
                problems.append(f"{name}: no parameter {parameter.name!r}")
            elif given.kind != parameter.kind and not (
                    parameter.kind == inspect.Parameter.KEYWORD_ONLY
                    and given.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD):
                problems.append(f"{name}: {parameter.name!r} is {given.kind.description}, not "
                                f"{parameter.kind.description}")
            elif given.default != parameter.default:
                problems.append(f"{name}: {parameter.name!r} defaults to {given.default!r}, not "
                                f"{parameter.default!r}")
        required = [p.name for p in offered.values() if p.default is inspect.Parameter.empty
                    and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
        if required:
            problems.append(f"{name}: requires {required}, which the protocol does not pass")
    return problems


@pytest.mark.parametrize(("protocol", "cls"), PAIRS, ids=[cls.__name__ for _, cls in PAIRS])
def test_both_client_trees_offer_every_member_of_their_protocol(protocol, cls):
    assert members(protocol), protocol  # the protocol is not empty
    assert not mismatches(protocol, cls), f"{cls.__name__} does not satisfy {protocol.__name__}"


def test_the_check_finds_a_missing_method_a_renamed_parameter_a_changed_default_and_an_extra_required_one():
    class Partial:
        def __init__(self) -> None:
            self.model_path = None

        def sample(self, prompt, count, sampling_params, include_prompt_logprobs=True, topk_prompt_logprobs=0):
            """``count`` where the protocol says ``num_samples``; another default."""

        def compute_logprobs(self, prompt, k):
            """``k`` required."""

    problems = mismatches(SamplingAPI, Partial)
    assert "sample: no parameter 'num_samples'" in problems
    assert "sample: 'include_prompt_logprobs' defaults to True, not False" in problems
    assert "compute_logprobs: requires ['k'], which the protocol does not pass" in problems
    assert {"sample_many: missing", "get_tokenizer: missing", "get_base_model: missing"} <= set(problems)
    assert not any(p.startswith("model_path") for p in problems)


def test_the_in_process_service_reports_no_worker_metrics_and_closes_nothing():
    service = ServiceClient.__new__(ServiceClient)  # no engine needed for these two
    assert service.distributed_metrics() == {}
    assert service.close() is None


def test_the_protocols_are_what_the_loop_types_its_clients_with():
    from rlvr.rl.phases import LoopRun

    hints = typing.get_type_hints(LoopRun)
    assert hints["service"] is ServiceAPI and hints["training_client"] is TrainingAPI
    assert hints["reference"] == SamplingAPI | None
