"""tinker-cookbook's recipes, unchanged, run against ``rlvr serve`` on ``tiny`` (their ``main`` and config functions
called with short options; nothing in them edited).

What the recipes need from their surroundings, and what this file gives them:

* a tokenizer and a renderer for ``tiny``: the cookbook looks tokenizers up by model name (registered here, as
  ``test_server_cookbook.py`` does) and picks a renderer from its registry of hub models (``model_info``), which does
  not list ``tiny``; ``role_colon``, the renderer for base models, is answered for ``tiny`` and every other name is
  left to the cookbook;
* data sets: ``rl_loop``, ``sl_loop``, the DPO recipe's ``hhh`` and the distillation recipe's ``deepmath`` call
  ``load_dataset`` on hub names (``openai/gsm8k``, ``HuggingFaceH4/no_robots``, ``Anthropic/hh-rlhf``,
  ``zwhe99/DeepMath-103K``) with no option to read a file, so ``datasets.load_dataset`` (and the name the
  distillation datasets module imported) answers those names from local rows (GSM8K-format problems and preference
  pairs written here; the cookbook's own ``example_data/conversations.jsonl``) and passes every other name to the
  real function; ``sl_basic`` takes the same file through its own ``FromConversationFileBuilder``;
* no price list from the web (``fetch_model_pricing``), and the root logger's handlers back after each run.

What each test shows: the supervised recipes' train NLL falls. ``rl_loop`` with its default loss resumes from a
supervised warm start left in its log folder (``_warm_start``) and its 0/1 reward rises. The DPO recipe's loss falls
and its margin rises on local hh-rlhf-format pairs. On-policy distillation (teacher: base ``tiny``; student: a LoRA
that starts elsewhere) brings the student's reverse KL to the teacher down. ``rl_basic``, ``math_rl``'s arithmetic
(synchronously and with ``async_config``) and ``guess_number`` (a multi-turn game) run end to end from a random
model, log every step, and the sampler and trainer agree on every sampled token (``kl_sample_train``); their rewards
stay flat (GSM8K's reward needs a ``\\boxed{...}`` answer that a random 330k-parameter model never writes, it cannot
add, and it never writes ``Guess: <n>``). ``rl_numerics_check`` needs SmolLM2 (``slow``). Each check that a number
moves fails at learning rate 0 (measured; see ``docs/server.md``).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tinker_cookbook", reason="needs tinker-cookbook: pip install --no-deps tinker-cookbook==0.6.1 "
                    "&& pip install chz==0.4.0 blobfile==3.3.0")

import datasets
import numpy as np
from tinker import types
from tinker_cookbook import model_info, tokenizer_utils

from rlvr.engine.models.tiny import build_tiny_tokenizer
from rlvr.fileio import read_jsonl

pytestmark = pytest.mark.slow  # the cookbook's recipes, whole, through the server

RENDERER = "role_colon"
CONVERSATIONS = Path(tokenizer_utils.__file__).parent / "example_data" / "conversations.jsonl"
SL_STEPS = 6
MIN_NLL_DROP = 0.3  # nats per token, first two steps against the last two
RL_STEPS = 3
NUMERICS_STEPS = 2  # rl_numerics_check on SmolLM2: its second step samples from the weights its first step trained
TOOL_RENDERER = "qwen3_instruct"
MAX_KL = 1e-3  # sampler against trainer logprobs of the same tokens under the same weights (float32 on tiny: ~1e-7)
ANSWER = 3  # every local GSM8K problem's answer
WARM_ROWS, WARM_STEPS, WARM_LR = 4, 20, 1e-2  # rl_loop's supervised warm start (``_warm_start``)
RL_LOOP_SEED = 0  # the warm start's LoRA and every rl_loop sampling request are seeded from it (``_seeded_samples``)
DPO_PAIRS, DPO_STEPS, DPO_LR = 48, 6, 1e-2
MIN_DPO_DROP = 0.05  # DPO loss (nats) and margin, first two steps against the last two
DISTILL_STEPS, DISTILL_LR, STUDENT_STEPS = 12, 5e-3, 10
DISTILL_SEED = 0  # the student's LoRA and every distillation sampling request are seeded from it
MAX_KL_LEFT = 0.75  # the last three steps' mean teacher_kl, as a share of the first step's (lr 0: ~1.0)
GUESS_TURNS = 3  # guess_number's turns a game (10 in the recipe)
RL_LOOP_STEPS, RL_LOOP_LR, RL_LOOP_BATCH = 10, 1e-3, 4
MIN_FINAL_REWARD = 0.7  # rl_loop's 0/1 reward over its last three steps (warm start alone: 0.44-0.52; trained: 0.79+)
SUFFIX = " Provide a numerical answer without units, written inside \\boxed{}."  # rl_loop's question suffix
FEWSHOT = [  # rl_loop's few-shot prefix, so that its warm start sees the prompts the recipe renders
    {"role": "user", "content": "How many r's are in strawberry?" + SUFFIX},
    {"role": "assistant", "content": "Let's spell the word out and number all the letters: 1) s 2) t 3) r 4) a 5) w "
     "6) b 7) e 8) r 9) r 10) y. We have r's at positions 3, 8, and 9. \\boxed{3}"},
]


def _gsm8k_rows(n: int) -> list[dict[str, str]]:
    """GSM8K-format rows (``question``, ``answer`` ending in ``#### n``) whose answer is always ``ANSWER``."""
    return [{"question": f"Tom has {i} apples and gives away {i - ANSWER}. How many are left?",
             "answer": f"{i} - {i - ANSWER} = {ANSWER}\n#### {ANSWER}"} for i in range(ANSWER + 1, ANSWER + 1 + n)]


def _preference_pairs(n: int) -> list[dict[str, str]]:
    """hh-rlhf-format pairs (``chosen`` / ``rejected`` transcripts that differ in the last reply only)."""
    return [{"chosen": f"\n\nHuman: What colour is the sky on day {i}?\n\nAssistant: The sky is blue.",
             "rejected": f"\n\nHuman: What colour is the sky on day {i}?\n\nAssistant: It is green, I think."}
            for i in range(n)]


@pytest.fixture
def recipes(server, monkeypatch, tmp_path, root_logging_kept):
    """The surroundings a cookbook recipe needs (see the module docstring), set for one test and undone after it."""
    monkeypatch.setenv("TINKER_API_KEY", server.api_key)
    tokenizer_utils.register_tokenizer("tiny", build_tiny_tokenizer)
    recommended = model_info.get_recommended_renderer_name
    monkeypatch.setattr(model_info, "get_recommended_renderer_name",
                        lambda name: RENDERER if name == "tiny" else recommended(name))
    files = {"openai/gsm8k": _gsm8k_rows(64),
             "HuggingFaceH4/no_robots": [json.loads(line) for line in CONVERSATIONS.read_text().splitlines()],
             "Anthropic/hh-rlhf": _preference_pairs(DPO_PAIRS),
             "zwhe99/DeepMath-103K": _gsm8k_rows(64),
             "Salesforce/wikitext": [{"text": f" The {word} of page {i} is the {word} of the book . "}
                                     for i in range(400) for word in ("time", "city", "world")]}
    load_dataset = datasets.load_dataset

    def local_load_dataset(path: str, *args: Any, **kwargs: Any) -> Any:
        if path in files and kwargs.get("split"):
            return datasets.Dataset.from_list(files[path])
        if path in files:
            return datasets.DatasetDict({"train": datasets.Dataset.from_list(files[path]),
                                         "test": datasets.Dataset.from_list(files[path][:8])})
        return load_dataset(path, *args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", local_load_dataset)
    from tinker_cookbook.distillation import datasets as distillation_datasets  # imports the name itself
    monkeypatch.setattr(distillation_datasets, "load_dataset", local_load_dataset)
    from tinker_cookbook.rl import train as rl_train
    from tinker_cookbook.supervised import train as sl_train
    for module in (rl_train, sl_train):  # they download a price list for their cost metrics
        monkeypatch.setattr(module, "fetch_model_pricing", lambda *args, **kwargs: None)
    yield server  # root_logging_kept puts back the root logger's handlers, which the recipes replace
    tokenizer_utils.unregister_tokenizer("tiny")


def _metric(log_path: Path, key: str) -> list[float]:
    return [row[key] for row in sorted(read_jsonl(log_path / "metrics.jsonl"), key=lambda r: r["step"]) if key in row]


def _rise(values: list[float], window: int = 2) -> float:
    return float(np.mean(values[-window:]) - np.mean(values[:window]))


def test_sl_loop_train_nll_falls(recipes, tmp_path):
    """``recipes/sl_loop.py``: supervised steps on the cookbook's example conversations; the train NLL falls."""
    from tinker_cookbook.recipes import sl_loop

    log_path = tmp_path / "sl_loop"
    sl_loop.main(sl_loop.Config(base_url=recipes.base_url, log_path=str(log_path), model_name="tiny", batch_size=4,
                                learning_rate=5e-3, max_length=256, save_every=0, max_steps=SL_STEPS,
                                ttl_seconds=None))
    nll = _metric(log_path, "train_mean_nll")
    assert len(nll) == SL_STEPS and _rise(nll) < -MIN_NLL_DROP, f"sl_loop's train NLL did not fall: {nll}"


def test_sl_basic_on_a_local_conversation_file_train_nll_falls(recipes, tmp_path):
    """``recipes/sl_basic.py``: its blueprint with the dataset swapped for a local file through the recipe's own
    ``FromConversationFileBuilder``; the train NLL falls."""
    from tinker_cookbook.recipes import sl_basic
    from tinker_cookbook.supervised.data import FromConversationFileBuilder
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    log_path = tmp_path / "sl_basic"
    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer="tiny", renderer_name=RENDERER, max_length=256,
                                            batch_size=4)
    config = sl_basic.build_config_blueprint("tiny").apply({
        "dataset_builder": FromConversationFileBuilder(common_config=common, file_path=str(CONVERSATIONS)),
        "log_path": str(log_path), "base_url": recipes.base_url, "learning_rate": 2e-2, "lora_rank": 8,
        "max_steps": SL_STEPS, "eval_every": 0, "save_every": 0}).make()
    sl_basic.main(config)
    nll = _metric(log_path, "train_mean_nll")
    assert len(nll) == SL_STEPS and _rise(nll) < -MIN_NLL_DROP, f"sl_basic's train NLL did not fall: {nll}"


def _supervised_state(server, conversations: list[list[dict[str, str]]], name: str, steps: int = WARM_STEPS,
                      seed: int | None = None) -> str:
    """A LoRA on ``tiny`` (its initial weights drawn from ``seed``) trained for ``steps`` cross-entropy steps on the
    last reply of each conversation, saved through the server; its ``tinker://`` state path."""
    import tinker
    from tinker_cookbook import renderers
    from tinker_cookbook.renderers import TrainOnWhat
    from tinker_cookbook.supervised.data import conversation_to_datum

    renderer = renderers.get_renderer(RENDERER, tokenizer_utils.get_tokenizer("tiny"))
    datums = [conversation_to_datum(convo, renderer, None, TrainOnWhat.LAST_ASSISTANT_MESSAGE)
              for convo in conversations]
    service = tinker.ServiceClient(base_url=server.base_url, api_key=server.api_key)
    training = service.create_lora_training_client(base_model="tiny", rank=8, seed=seed).result()
    for _ in range(steps):
        training.forward_backward(datums, "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=WARM_LR))
    return training.save_state(name).result().path


def _warm_start(server, log_path: Path) -> None:
    """A supervised warm start for ``rl_loop``, left where the recipe resumes from: ``_supervised_state`` on
    rl_loop's own prompts (its few-shot prefix and question suffix) with replies alternating ``\\boxed{3}`` and
    ``\\boxed{4}``, recorded in ``log_path/checkpoints.jsonl`` at batch 0. rl_loop has no option for a starting
    checkpoint, but on start it resumes from the last state recorded in its log folder."""
    state_path = _supervised_state(server, [
        [*FEWSHOT, {"role": "user", "content": row["question"] + SUFFIX},
         {"role": "assistant", "content": f"\\boxed{{{ANSWER + i % 2}}}"}]
        for i, row in enumerate(_gsm8k_rows(WARM_ROWS))], "warm_start", seed=RL_LOOP_SEED)
    log_path.mkdir(parents=True)
    (log_path / "checkpoints.jsonl").write_text(json.dumps({"name": "warm_start", "batch": 0,
                                                            "state_path": state_path}) + "\n")


def _seeded_samples(monkeypatch, seed: int) -> None:
    """Give the n-th ``SamplingClient.sample`` request without a seed the seed ``seed * 2**20 + n``. The recipes send
    no seed, and make their requests in the same order from run to run (rl_loop one after another from one thread;
    the asyncio recipes start a step's rollouts in the order of its groups, each asking before it first waits), so n
    is the same from run to run. The server decodes a seeded request the same whatever is batched beside it, so the
    run's samples, and so its rewards, depend neither on the order its concurrent requests arrive in nor on what ran
    before it on the shared server."""
    import tinker

    unseeded = tinker.SamplingClient.sample
    calls = itertools.count()

    def sample(self, prompt, num_samples, sampling_params, *args, **kwargs):
        if sampling_params.seed is None:
            sampling_params = sampling_params.model_copy(update={"seed": seed * 2**20 + next(calls)})
        return unseeded(self, prompt, num_samples, sampling_params, *args, **kwargs)

    monkeypatch.setattr(tinker.SamplingClient, "sample", sample)


def _warm_problems_only(monkeypatch) -> None:
    """rl_loop's GSM8K is the warm start's own ``WARM_ROWS`` problems, over and over: each batch of four is the four
    problems the warm start answers 3 or 4 to about equally often. (On later, unseen problems the warm start's
    answers drift off the format, and the reward falls whatever the learning rate, 0 included.)"""
    rows = _gsm8k_rows(WARM_ROWS) * (RL_LOOP_STEPS * RL_LOOP_BATCH // WARM_ROWS)
    load_dataset = datasets.load_dataset  # the recipes fixture's local one

    def warm_load_dataset(path: str, *args: Any, **kwargs: Any) -> Any:
        if path == "openai/gsm8k":
            return datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)})
        return load_dataset(path, *args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", warm_load_dataset)


def test_rl_loop_reward_rises_from_a_warm_start_with_its_default_loss(recipes, tmp_path, monkeypatch):
    """``recipes/rl_loop.py`` with its default loss (stable_reinforce) on local GSM8K-format problems, resumed from
    a supervised warm start (``_warm_start``) that answers ``\\boxed{3}`` (right) or ``\\boxed{4}`` (wrong) about
    equally often, on the warm start's own problems (``_warm_problems_only``) with seeded samples
    (``_seeded_samples``): over ten steps the reward rises from about 0.5 to over 0.85 (the last three steps' mean;
    0.79-0.95 over seeds 0-19), the final state and sampler checkpoints are written and load back through the server.
    With ``learning_rate=0`` the last three steps average 0.44-0.52 and the same assertion fails."""
    import tinker
    from tinker_cookbook.recipes import rl_loop

    _seeded_samples(monkeypatch, RL_LOOP_SEED)
    _warm_problems_only(monkeypatch)
    log_path = tmp_path / "rl_loop"
    _warm_start(recipes, log_path)
    config = rl_loop.Config(base_url=recipes.base_url, log_path=str(log_path), model_name="tiny",
                            batch_size=RL_LOOP_BATCH, group_size=8, learning_rate=RL_LOOP_LR, max_tokens=20,
                            save_every=0, max_steps=RL_LOOP_STEPS, ttl_seconds=None)
    assert config.loss_fn == "stable_reinforce"  # the recipe's default, kept
    rl_loop.main(config)
    reward = _metric(log_path, "reward/total")
    assert len(reward) == RL_LOOP_STEPS and np.mean(reward[-3:]) > MIN_FINAL_REWARD, f"rl_loop did not learn: {reward}"
    final = json.loads((log_path / "checkpoints.jsonl").read_text().splitlines()[-1])
    assert final["name"] == "final" and final["state_path"].startswith("tinker://"), final
    service = tinker.ServiceClient(base_url=recipes.base_url, api_key=recipes.api_key)
    sampler = service.create_sampling_client(model_path=final["sampler_path"]).result()
    assert sampler.sample(types.ModelInput.from_ints([72, 105]), 1, types.SamplingParams(max_tokens=2)).result()


def test_rl_basic_runs_end_to_end(recipes, tmp_path):
    """``recipes/rl_basic.py``: its blueprint for ``tiny``, with its own ``Gsm8kDatasetBuilder`` made small (the
    local GSM8K rows answer its hub name); every step logs, the sampler and trainer agree on the sampled tokens, and
    the final checkpoint is recorded. Its reward, like rl_loop's, stays flat on a random model."""
    from tinker_cookbook.recipes import rl_basic
    from tinker_cookbook.recipes.math_rl.math_env import Gsm8kDatasetBuilder

    log_path = tmp_path / "rl_basic"
    config = rl_basic.build_config_blueprint("tiny").apply({
        "dataset_builder": Gsm8kDatasetBuilder(batch_size=2, group_size=4, renderer_name=RENDERER,
                                               model_name_for_tokenizer="tiny"),
        "log_path": str(log_path), "base_url": recipes.base_url, "max_tokens": 8, "lora_rank": 8,
        "learning_rate": 1e-2, "max_steps": RL_STEPS, "save_every": 0}).make()
    rl_basic.main(config)
    assert len(_metric(log_path, "env/all/reward/total")) == RL_STEPS
    kl = _metric(log_path, "optim/kl_sample_train_v1")
    assert kl and max(abs(k) for k in kl) < MAX_KL, f"sampler and trainer disagree: kl_sample_train_v1 {kl}"
    final = json.loads((log_path / "checkpoints.jsonl").read_text().splitlines()[-1])
    assert final["name"] == "final" and final["state_path"].startswith("tinker://"), final


def test_dpo_on_local_pairs_loss_falls_and_margin_rises(recipes, tmp_path):
    """``recipes/preference/dpo/train.py`` with its ``hhh`` dataset (the local hh-rlhf-format pairs answer the hub
    name): DPO through ``forward_backward_custom`` against a reference sampler of the initial weights. Its first step
    sits at ``log 2`` (policy = reference); the DPO loss then falls and the chosen-over-rejected margin rises (with
    ``learning_rate=0`` both stay put and the assertions fail)."""
    from tinker_cookbook.recipes.preference.dpo import train as dpo

    log_path = tmp_path / "dpo"
    dpo.cli_main(dpo.CLIConfig(model_name="tiny", renderer_name=RENDERER, dataset="hhh", learning_rate=DPO_LR,
                               batch_size=8, max_length=256, max_steps=DPO_STEPS, base_url=recipes.base_url,
                               log_path=str(log_path), behavior_if_log_dir_exists="delete"))
    loss, margin = _metric(log_path, "dpo_loss"), _metric(log_path, "margin")
    assert len(loss) == DPO_STEPS and abs(loss[0] - np.log(2)) < 1e-4, f"DPO's first step is not at log 2: {loss}"
    assert _rise(loss) < -MIN_DPO_DROP and _rise(margin) > MIN_DPO_DROP, f"DPO loss {loss}, margin {margin}"


def test_on_policy_distillation_student_moves_to_the_base_model(recipes, tmp_path, monkeypatch):
    """``recipes/distillation/on_policy_distillation.py`` with teacher = the base ``tiny`` and student = a LoRA on it,
    on its ``deepmath`` prompts (the local GSM8K-format questions answer the hub name). The student starts from its
    own ``load_checkpoint_path``: a LoRA trained to answer every question ``\\boxed{4}`` (``_supervised_state``), so
    it starts far from the teacher; the reverse KL to the teacher on the student's samples (``teacher_kl``, the
    recipe's only training signal) falls, 5.3-5.8 -> 0.3-0.8 over 12 steps. The student's LoRA and every sampling
    request are seeded from ``DISTILL_SEED`` (``_seeded_samples``), so the run is the same whatever ran before it on
    the shared server. Over seeds 0-19 the last three steps' mean is 0.07-0.14 of the first step's; the bar,
    ``MAX_KL_LEFT``, is 0.75. That leaves room for the slow trajectories another machine's rounding may take: a student
    sure of its samples has little gradient on them, and unseeded, 2 runs in 19 sat on a plateau at 0.54 and 0.64.
    With ``learning_rate=0`` the share stays near 1.0 and the assertion fails."""
    import asyncio

    from tinker_cookbook.recipes.distillation import on_policy_distillation as distillation

    _seeded_samples(monkeypatch, DISTILL_SEED)
    student = _supervised_state(recipes, [[{"role": "user", "content": row["question"]},
                                           {"role": "assistant", "content": f"\\boxed{{{ANSWER + 1}}}"}]
                                          for row in _gsm8k_rows(WARM_ROWS)], "student", STUDENT_STEPS,
                                seed=DISTILL_SEED)
    log_path = tmp_path / "distillation"
    asyncio.run(distillation.cli_main(distillation.CLIConfig(
        model_name="tiny", teacher_model="tiny", renderer_name=RENDERER, load_checkpoint_path=student, lora_rank=8,
        dataset="deepmath", group_size=4, groups_per_batch=4, learning_rate=DISTILL_LR, max_tokens=10,
        eval_every=0, save_every=0, max_steps=DISTILL_STEPS, base_url=recipes.base_url, log_path=str(log_path),
        behavior_if_log_dir_exists="delete")))
    kl = _metric(log_path, "teacher_kl")
    assert len(kl) == DISTILL_STEPS and np.mean(kl[-3:]) < MAX_KL_LEFT * kl[0], f"teacher_kl did not fall: {kl}"


def test_guess_number_multi_turn_game_runs(recipes, monkeypatch, tmp_path):
    """``recipes/multiplayer_rl/guess_number``: a multi-turn game with no hub (the env answers "Too low" / "Too
    high" / "Correct", or a format message and -1 for a reply that is not ``Guess: <n>``). Shortened to
    ``GUESS_TURNS`` turns a game (the module's ``MAX_TURNS``; its 10 turns of failed-parse messages pass tiny's
    1,024-token context) and run through its own ``build_config``, which has no ``base_url`` option (the SDK reads
    ``TINKER_BASE_URL``). What it shows: every step logs, each game lasts its turns, and sampler and trainer agree
    on every sampled token of the multi-turn trajectories (``kl_sample_train_v1`` ~ 0). Not shown: learning; a random
    tiny model never writes ``Guess: <n>``, so every game scores ``-GUESS_TURNS`` and every group's advantages are
    0."""
    import asyncio

    from tinker_cookbook.recipes.multiplayer_rl.guess_number import env as guess_env
    from tinker_cookbook.recipes.multiplayer_rl.guess_number import train as guess

    monkeypatch.setattr(guess_env, "MAX_TURNS", GUESS_TURNS)
    monkeypatch.setenv("TINKER_BASE_URL", recipes.base_url)
    log_path = tmp_path / "guess_number"
    config = guess.build_config(guess.CLIConfig(
        model_name="tiny", renderer_name=RENDERER, group_size=4, batch_size=1, learning_rate=1e-2, max_tokens=10,
        eval_every=0, save_every=0, max_steps=RL_STEPS, log_path=str(log_path)))
    asyncio.run(guess.train.main(config))
    assert _metric(log_path, "env/all/turns_per_episode") == [GUESS_TURNS] * RL_STEPS
    assert len(_metric(log_path, "env/all/reward/total")) == RL_STEPS
    kl = _metric(log_path, "optim/kl_sample_train_v1")
    assert len(kl) == RL_STEPS and max(abs(k) for k in kl) < MAX_KL, f"sampler and trainer disagree: {kl}"


@pytest.mark.parametrize("off_policy", [None, 1], ids=["sync", "async_config"])
def test_math_rl_arithmetic_runs_sync_and_async(recipes, tmp_path, off_policy):
    """``recipes/math_rl/train.py`` on its arithmetic environment, synchronous and with ``async_config``
    (``max_steps_off_policy=1``): every step logs the environment's reward, correctness and sampler/trainer KL,
    and synchronously the sampler and trainer agree on the sampled tokens' logprobs (``kl_sample_train_v1`` ~ 0)."""
    import asyncio

    from tinker_cookbook.recipes.math_rl import train as math_rl

    log_path = tmp_path / "math_rl"
    asyncio.run(math_rl.cli_main(math_rl.CLIConfig(
        model_name="tiny", renderer_name=RENDERER, env="arithmetic", group_size=4, groups_per_batch=4,
        learning_rate=1e-2, max_tokens=5, lora_rank=8, eval_every=0, save_every=0, max_steps=RL_STEPS,
        max_steps_off_policy=off_policy, base_url=recipes.base_url, log_path=str(log_path),
        behavior_if_log_dir_exists="delete")))
    assert len(_metric(log_path, "env/all/reward/total")) == RL_STEPS
    assert len(_metric(log_path, "env/all/correct")) == RL_STEPS
    kl = _metric(log_path, "optim/kl_sample_train_v1")
    assert len(kl) == RL_STEPS, kl
    # Synchronous: sampled with the weights it trains, so the two agree. With async_config, a batch may have been
    # sampled a step before the weights it trains (off policy), and the difference is the policy's own change.
    if off_policy is None:
        assert max(abs(k) for k in kl) < MAX_KL, f"sampler and trainer disagree: kl_sample_train_v1 {kl}"


@pytest.mark.slow
def test_rl_numerics_check_sampler_and_trainer_agree(recipes, service, tmp_path):
    """``recipes/rl_numerics_check``: its counting environment (a read_page tool over pages of text) on local text
    in place of WikiText-103, on SmolLM2-135M (its tool-use system prompt alone is ~1,500 of tiny's byte tokens,
    past tiny's 1,024-token context), rendered with ``qwen3_instruct`` (SmolLM2 speaks ChatML; role_colon has no
    tool calls); the check it exists for passes: ``optim/kl_sample_train_v1`` and ``_v2`` stay ~0 at every step."""
    import asyncio

    from tinker_cookbook.recipes.rl_numerics_check import env as numerics_env
    from tinker_cookbook.recipes.rl_numerics_check import train as numerics

    from rlvr.engine.models.load import SMOLLM2

    tokenizer = service.create_sampling_client(base_model=SMOLLM2).get_tokenizer()
    tokenizer_utils.register_tokenizer(SMOLLM2, lambda: tokenizer)
    numerics_env.load_wikitext_corpus.cache_clear()
    log_path = tmp_path / "numerics"
    config = numerics.build_config(numerics.CLIConfig(
        model_name=SMOLLM2, renderer_name=TOOL_RENDERER, lora_rank=8, learning_rate=1e-4, group_size=4,
        groups_per_batch=1, max_tokens=24, max_trajectory_tokens=1500, max_steps=NUMERICS_STEPS, save_every=0,
        base_url=recipes.base_url, log_path=str(log_path),
        task=numerics_env.CountingTaskConfig(num_pages_min=1, num_pages_max=2, page_chars=200)))
    try:
        asyncio.run(numerics.train.main(config))
    finally:
        tokenizer_utils.unregister_tokenizer(SMOLLM2)
    for key in ("optim/kl_sample_train_v1", "optim/kl_sample_train_v2"):
        kl = _metric(log_path, key)
        assert len(kl) == NUMERICS_STEPS and max(abs(k) for k in kl) < MAX_KL, f"{key}: {kl}"
