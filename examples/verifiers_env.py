"""A verifiers environment trained through rlvr's loop: one-digit sums, the answer checked by a verifiers rubric;
with ``--turns 2`` a wrong answer gets "Not quite, try again." and a second turn (a ``MultiTurnEnv``).

    .venv/bin/python examples/verifiers_env.py [--steps 10] [--turns 1] [--model smollm2-135m] [--out runs/vf]

Needs ``pip install 'rlvr[verifiers]' 'verifiers<0.4'`` (0.4's v1 tasksets train through
``rlvr.integrations.verifiers_v1``).
The module is also an installable verifiers environment: with examples/ on ``PYTHONPATH``,
``VerifiersDataset("verifiers_env", tokenizer)`` loads it by id through ``load_environment``.
"""

from __future__ import annotations

import argparse
import random
import re

import verifiers as vf
from datasets import Dataset


def sums(n: int, seed: int = 0) -> Dataset:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randrange(10), rng.randrange(10)
        rows.append({"question": f"What is {a} + {b}? Answer with only the number.", "answer": str(a + b)})
    return Dataset.from_list(rows)


def last_number(text: str) -> str | None:
    found = re.findall(r"-?\d+", text or "")
    return found[-1] if found else None


def correct(completion, answer) -> float:
    """1.0 when the last number of the model's last answer is the sum."""
    replies = [m["content"] for m in completion if m["role"] == "assistant"]
    return float(bool(replies) and last_number(replies[-1]) == answer)


def brief(completion) -> float:
    """A small bonus for short answers (weight 0.1)."""
    replies = [m["content"] or "" for m in completion if m["role"] == "assistant"]
    return 1.0 / (1 + len(replies[-1])) if replies else 0.0


class TryAgain(vf.MultiTurnEnv):
    """A wrong answer gets one more chance; a right one ends the episode."""

    async def env_response(self, messages, state, **kwargs):
        if last_number(messages[-1]["content"]) == state["answer"]:
            state["final_env_response"] = []
            return []
        return [vf.UserMessage(content="Not quite, try again.")]


def load_environment(turns: int = 1, num_examples: int = 256, seed: int = 0) -> vf.Environment:
    rubric = vf.Rubric(funcs=[correct, brief], weights=[1.0, 0.1])
    if turns == 1:
        return vf.SingleTurnEnv(dataset=sums(num_examples, seed), rubric=rubric)
    return TryAgain(dataset=sums(num_examples, seed), rubric=rubric, max_turns=turns)


def main() -> None:
    import rlvr
    from rlvr.integrations.verifiers_env import VerifiersDataset
    from rlvr.rl import LoopConfig, train

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--turns", type=int, default=1)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--out", default="runs/vf")
    args = parser.parse_args()

    tokenizer = rlvr.ServiceClient().create_sampling_client(base_model=args.model).get_tokenizer()
    dataset = VerifiersDataset(load_environment(args.turns), tokenizer, groups_per_batch=4, group_size=8)
    config = LoopConfig(base_model=args.model, steps=args.steps, group_size=8, max_tokens=12, learning_rate=2e-4,
                        out=args.out, seed=0)
    train(config, dataset, progress=lambda step, m: print(
        f"step {step:3d}  rubric reward {m['env/all/reward/mean']:.3f}  correct {m['env/all/rubric/correct']:.3f}  "
        f"failed {m['env/all/reward/errors:sum']:.0f}  datums {m['train/datums']}  {m['time/total']:.1f}s", flush=True))


if __name__ == "__main__":
    main()
