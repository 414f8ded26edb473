"""Problem sources for RLVR: a problem, how to prompt for it through a chat template, and how to check an answer.

    from rlvr.engine.models.tiny import build_tiny_tokenizer
    from rlvr.tasks import ArithmeticSource, Gsm8kSource

    source = Gsm8kSource({"train": "gsm8k/train.jsonl"}, few_shot=2, system_prompt="You are a careful solver.")
    problem = source.problems("train", shuffle=True, seed=0)[0]
    prompt = source.render(problem, tokenizer)                   # through tokenizer.apply_chat_template
    source.score(problem, "... so the answer is \\boxed{72}.")   # 1.0 when 72 is right
    # batches: rlvr.rewards.score_batch(source.reward(), [(prompt, response, problem.reward_meta()), ...])

Sources: :class:`ArithmeticSource` (generated, difficulty levels for curricula), :class:`RpnSource` (Simplexity
RPN), :class:`ReasoningGymSource` (reasoning-gym's datasets, an extra), :class:`Gsm8kSource` (``####`` answers),
:class:`MathSource` (``\\boxed{}``), :class:`MbppSource` and :class:`HumanEvalSource` (code with tests, run in the
sandbox), :class:`FileSource` (any JSONL/JSON/Parquet file or records with a :class:`FieldMap`), and
:class:`HubDataset` for Hugging Face data sets when the hub is reachable.
"""

from rlvr.tasks.arithmetic import ArithmeticLevel, ArithmeticSource
from rlvr.tasks.base import Problem, ProblemSource, select
from rlvr.tasks.code import HumanEvalSource, MbppSource, human_eval_path
from rlvr.tasks.files import FieldMap, FileSource, HubDataset, RecordSource, read_records
from rlvr.tasks.math import Gsm8kSource, MathSource
from rlvr.tasks.reasoning_gym import ReasoningGymSource
from rlvr.tasks.rpn import RpnSource, evaluate_rpn

__all__ = [
    "ArithmeticLevel",
    "ArithmeticSource",
    "FieldMap",
    "FileSource",
    "Gsm8kSource",
    "HubDataset",
    "HumanEvalSource",
    "MathSource",
    "MbppSource",
    "Problem",
    "ProblemSource",
    "ReasoningGymSource",
    "RecordSource",
    "RpnSource",
    "evaluate_rpn",
    "human_eval_path",
    "read_records",
    "select",
]
