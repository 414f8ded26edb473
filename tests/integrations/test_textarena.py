"""textarena games as envs: scripted games end with the outcome as the reward (win, draw, loss, invalid moves),
bad names and failing games are clear errors, and the loop trains on the recipe with the outcome logged."""

import io
import json
import random

import pytest

pytest.importorskip("textarena")

from rlvr.app.settings import resolve_config
from rlvr.app.sources import build_source
from rlvr.engine.models.tiny import build_tiny_tokenizer
from rlvr.errors import ConfigurationError, RewardError
from rlvr.integrations.textarena import TextArenaDataset, TextArenaEnv


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def lowest_empty(game_state, rng):
    """A predictable opponent: the lowest-numbered empty cell."""
    board = game_state["board"]
    return f"[{min(r * 3 + c for r in range(3) for c in range(3) if board[r][c] == '')}]"


def play(env, tokenizer, moves):
    """Each move as the model's reply (ending with the stop token, as sampled); the StepResults."""
    results = []
    for move in moves:
        results.append(env.step(tokenizer.encode(move + "<|im_end|>", add_special_tokens=False)))
        if results[-1].done:
            break
    return results


def test_a_won_game_rewards_1_and_each_turn_shows_the_opponents_move(tokenizer):
    env = TextArenaEnv("TicTacToe-v0", tokenizer, seed=1, seat=0, opponent=lowest_empty)
    first = tokenizer.decode(env.initial_observation())
    assert first.startswith("<|im_start|>user\n[GAME] You are Player 0 in Tic Tac Toe.")
    assert first.endswith("<|im_start|>assistant\n")
    # model 4, opponent 0; model 3, opponent 1; model 5: the middle row
    results = play(env, tokenizer, ["[4]", "[3]", "[5]"])
    assert [r.reward for r in results] == [0.0, 0.0, 1.0] and [r.done for r in results] == [False, False, True]
    assert results[-1].metrics == {"invalid_move": 0.0, "win": 1.0, "draw": 0.0, "loss": 0.0, "moves": 3.0}
    second = tokenizer.decode(results[0].next_observation)
    assert second.startswith(first + "[4]<|im_end|>\n<|im_start|>user\n")  # one growing conversation
    assert "[Player 1] [0]" in second and "placed their symbol (X) in cell 0" in second
    assert "[Player 0] [4]" not in second  # the model's own move is its turn, not repeated as the game's message


def test_a_lost_game_rewards_minus_1_and_a_draw_0(tokenizer):
    lost = TextArenaEnv("TicTacToe-v0", tokenizer, seed=1, seat=1, opponent=lowest_empty)
    assert "[Player 0] [0]" in tokenizer.decode(lost.initial_observation())  # the opponent moved first
    results = play(lost, tokenizer, ["[8]", "[7]"])  # the opponent takes 0, 1, 2
    assert [r.reward for r in results] == [0.0, -1.0]
    assert results[-1].metrics["loss"] == 1.0 and results[-1].metrics["moves"] == 2.0
    drawn = TextArenaEnv("TicTacToe-v0", tokenizer, seed=1, seat=0, opponent=lowest_empty)
    drawn.initial_observation()
    results = play(drawn, tokenizer, ["[1]", "[3]", "[4]", "[6]", "[8]"])
    assert results[-1].done and results[-1].reward == 0.0 and results[-1].metrics["draw"] == 1.0


def test_an_invalid_move_is_pointed_out_and_a_second_loses(tokenizer):
    env = TextArenaEnv("TicTacToe-v0", tokenizer, seed=1, seat=0, opponent=lowest_empty)
    env.initial_observation()
    first = play(env, tokenizer, ["hello"])[0]
    assert (first.reward, first.done, first.metrics) == (0.0, False, {"invalid_move": 1.0})
    assert "attempted an invalid move" in tokenizer.decode(first.next_observation)
    second = play(env, tokenizer, ["[9]"])[0]  # off the board: the second invalid move in a row
    assert (second.reward, second.done) == (-1.0, True)
    assert second.metrics["invalid_move"] == 1.0 and second.metrics["loss"] == 1.0


def test_a_group_replays_one_seeded_game_and_leaves_the_global_random_alone(tokenizer):
    dataset = TextArenaDataset("TicTacToe-v0", tokenizer, games_per_batch=2, group_size=3, seed=7)
    [first, second] = dataset.get_batch(0)
    assert (first.seat, second.seat) == (0, 1)  # seats alternate game by game
    state = random.getstate()
    transcripts = []
    for env in first.make_envs():
        observation = env.initial_observation()
        for result in play(env, tokenizer, ["[0]", "[1]", "[2]", "[3]", "[4]", "[5]", "[6]", "[7]", "[8]"]):
            observation = result.next_observation or observation
        transcripts.append(observation)
    assert transcripts[0] == transcripts[1] == transcripts[2]  # the same opponent moves for the same play
    assert random.getstate() == state
    again = TextArenaDataset("TicTacToe-v0", tokenizer, games_per_batch=2, group_size=3, seed=7)
    assert [g.seed for g in again.get_batch(0)] == [first.seed, second.seed]
    assert len({g.seed for g in dataset.get_batch(1)} | {first.seed, second.seed}) == 4
    assert {g.seed for g in dataset.test_groups()}.isdisjoint({first.seed, second.seed})


def test_the_instruction_follows_the_games_first_message_only(tokenizer):
    dataset = TextArenaDataset("Nim-v0", tokenizer, games_per_batch=1, seat=0, instruction="Reply with only your move.")
    env = dataset.get_batch(0)[0].make_envs()[0]
    first = tokenizer.decode(env.initial_observation())
    assert first.endswith("pile 2: 5\n\nReply with only your move.<|im_end|>\n<|im_start|>assistant\n")
    [result] = play(env, tokenizer, ["[0 1]"])
    assert tokenizer.decode(result.next_observation).count("Reply with only your move.") == 1


def test_an_unknown_game_or_one_without_an_opponent_is_a_clear_error():
    with pytest.raises(ConfigurationError, match=r"'TicTacToe-v9' is not a textarena environment \(did you mean "
                                                 r"TicTacToe-v0.*built-in opponent: ConnectFour-v0, Nim-v0, "
                                                 r"TicTacToe-v0 and their variants.*list_games\(\)"):
        TextArenaDataset("TicTacToe-v9")
    with pytest.raises(ConfigurationError, match=r"'Chess-v0' \(ChessEnv\) has no built-in opponent: choose a game "
                                                 r"with one \(ConnectFour-v0, .*opponent="):
        TextArenaDataset("Chess-v0")
    with pytest.raises(ConfigurationError, match=r"task.env_id='Tictactoe' is not a textarena environment"):
        build_source(resolve_config(recipe="textarena", overrides=["task.env_id=Tictactoe"]))
    with pytest.raises(ConfigurationError, match=r"reward='math_correct': recipe 'textarena' plays games"):
        build_source(resolve_config(recipe="textarena", overrides=["reward=math_correct"]))


def test_a_game_that_raises_is_a_reward_error_naming_it(tokenizer):
    def broken(game_state, rng):
        raise KeyError("board")

    env = TextArenaEnv("TicTacToe-v0", tokenizer, seed=3, seat=1, opponent=broken)
    with pytest.raises(RewardError, match=r"textarena TicTacToe-v0 \(game seed 3, seat 1\) raised in the opponent's "
                                          r"move: KeyError: 'board'"):
        env.initial_observation()
    env = TextArenaEnv("TicTacToe-v0", tokenizer, seed=3, seat=0, opponent=lowest_empty)
    env.initial_observation()
    env.game.env.step = lambda action: 1 / 0  # the game itself fails mid-episode
    with pytest.raises(RewardError, match=r"raised in step: ZeroDivisionError"):
        play(env, tokenizer, ["[4]"])


def test_the_recipe_trains_tiny_with_the_outcome_as_reward(tmp_path):
    from rich.console import Console

    from rlvr.app.evaluation import evaluate
    from rlvr.app.run import train

    # Nim: its conversation stays within tiny's 1,024-byte context for 3 turns (TicTacToe's passes it in 3)
    settings = {"recipe": "textarena", "task": {"env_id": "Nim-v0"}, "base_model": "tiny", "steps": 2,
                "problems_per_step": 2, "group_size": 2, "max_tokens": 4, "max_turns": 3, "eval_problems": 2,
                "save_every": 0, "out": str(tmp_path / "run")}
    result = train(settings, console=Console(file=io.StringIO()))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 1]
    for row in rows:
        mean = row["env/all/reward/mean"]  # of 4 games, each +1, 0 or -1 (0 also: cut short)
        assert -1.0 <= mean <= 1.0 and mean * 4 == round(mean * 4)
        ended = [row.get(f"env/all/{k}") for k in ("win", "draw", "loss")]
        assert None not in ended and sum(ended) == pytest.approx(1.0)  # averaged over the games that ended
        assert 0.0 <= row["env/all/invalid_move"] <= 1.0
    assert set(result["summary"]["after"]) >= {"test/reward/mean", "test/correct", "test/turns"}
    scored = evaluate(dict(settings, out=str(tmp_path / "eval")), problems=1)
    assert scored["problems"] == 1 and -1.0 <= scored["test/reward/mean"] <= 1.0


def test_the_loop_streams_a_batch_of_games_in_parts_off_policy(tmp_path):
    # an env dataset's batch in two parts (one group of games each), played one after another a step ahead of
    # training: every game of every step is played and scored, each batch one update old after the first
    from rlvr.rl import LoopConfig
    from rlvr.rl import train as train_loop

    dataset = TextArenaDataset("Nim-v0", games_per_batch=2, group_size=2, num_batches=3, test_games=0)
    config = LoopConfig(base_model="tiny", rank=4, steps=3, max_tokens=4, max_turns=3, stream_minibatches=2,
                        max_steps_off_policy=1, save_every=0, out=str(tmp_path / "run"))
    train_loop(config, dataset)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["async/steps_off_policy"] for row in rows] == [0, 1, 1]
    assert all(row["env/all/reward/scored:sum"] == 4 for row in rows)  # 2 groups x 2 games, both parts
