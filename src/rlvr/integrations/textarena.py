"""TextArena's two-player games as multi-turn envs: the model plays one seat against a fixed opponent policy, and the
game's outcome for its seat is the episode's reward.

    dataset = TextArenaDataset("TicTacToe-v0", tokenizer, games_per_batch=4, group_size=8, seed=0)
    train(LoopConfig(base_model="smollm2-135m", max_turns=10, ...), dataset)      # or: rlvr train --recipe textarena

Each episode is one game. The model's first observation is the game's messages to its seat as a user turn through
the chat template; its reply is its move; after the opponent's move the game's new messages are the next user turn,
appended to what the model saw and sampled (one growing conversation, one datum: ``envs.trajectory_datums``).

Reward, at the game's end (earlier turns earn 0), for the model's seat: win +1, draw 0, loss -1. A first invalid
move is pointed out and the model moves again; a second in a row loses (-1). A game cut short by ``max_turns`` ends
with 0 (``env/all/unfinished``). Metrics: ``win``, ``draw``, ``loss``, ``moves`` at the end, ``invalid_move`` per move.

The opponent is a function of the game's state and a random generator (:data:`Opponent`); built in: a random legal
move for TicTacToe, Nim and ConnectFour and their variants; other games take ``opponent=``. All envs of a group share
a game seed, so the group's advantages compare play in the same game; held-out games are another seed stream.

Not here: self-play (both seats sampled within one env step, which the Env interface does not do; an opponent that
samples a frozen model fits :data:`Opponent`); games of one or more than two players; games that download data on
import (``nltk.download`` in the word games) on a machine without the network.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import random
from collections.abc import Callable, Iterator
from typing import Any

from rlvr.errors import ConfigurationError, RewardError
from rlvr.rl.envs import Env, EnvGroupBuilder, RLDataset, StepResult, batch_positions, extend_conversation
from rlvr.tasks.base import render_messages

__all__ = ["OPPONENTS", "Opponent", "TextArenaDataset", "TextArenaEnv", "TextArenaGroupBuilder", "list_games"]

Opponent = Callable[[dict[str, Any], random.Random], str]
"""A fixed policy: the game's state (textarena's ``state.game_state``, a copy) and the episode's generator -> the
opponent's move as text (``"[4]"``)."""

OPPONENT_MOVES = 64
"""Moves the opponent may make in a row (invalid ones included) before the game is declared stuck."""

LIST_GAMES = "python -c 'import rlvr.integrations.textarena as t; print(t.list_games())'"


def random_tictactoe(game_state: dict[str, Any], rng: random.Random) -> str:
    """A random empty cell of TicTacToe's 3 x 3 board."""
    board = game_state["board"]
    return f"[{rng.choice([r * 3 + c for r, row in enumerate(board) for c, v in enumerate(row) if v == ''])}]"


def random_nim(game_state: dict[str, Any], rng: random.Random) -> str:
    """A random number of objects from a random non-empty pile."""
    pile, size = rng.choice([(i, n) for i, n in enumerate(game_state["piles"]) if n > 0])
    return f"[{pile} {rng.randint(1, size)}]"


def random_connect_four(game_state: dict[str, Any], rng: random.Random) -> str:
    """A random column that is not full."""
    top = game_state["board"][0]
    return f"[col {rng.choice([c for c, v in enumerate(top) if v == '.'])}]"


OPPONENTS: dict[str, Opponent] = {"TicTacToeEnv": random_tictactoe, "NimEnv": random_nim,
                                  "ConnectFourEnv": random_connect_four}
"""Built-in opponents by textarena game class (every env id registered with that class uses it)."""


def _textarena() -> Any:
    try:
        import textarena
    except ImportError as exc:
        raise ConfigurationError(f"the textarena envs need textarena: pip install 'rlvr[textarena]' ({exc})") from exc
    return textarena


def _registry() -> dict[str, Any]:
    _textarena()
    from textarena.envs.registration import ENV_REGISTRY

    return ENV_REGISTRY


def _game_class(env_id: str) -> str:
    """The class name of ``env_id``'s game, read from the registry (its module is not imported)."""
    entry = _registry()[env_id].entry_point
    return entry.rsplit(":", 1)[-1] if isinstance(entry, str) else entry.__name__


def list_games(with_opponent: bool = False) -> list[str]:
    """textarena's registered env ids; ``with_opponent``: only those with a built-in opponent."""
    return sorted(env_id for env_id in _registry() if not with_opponent or _game_class(env_id) in OPPONENTS)


def _with_opponent() -> str:
    """The games with a built-in opponent, for error messages: ``ConnectFour-v0, ... and their variants``."""
    games = sorted({env_id.split("-v0")[0] + "-v0" for env_id in list_games(with_opponent=True)})
    return f"{', '.join(games)} and their variants"


def resolve_opponent(env_id: str, opponent: Opponent | None = None) -> Opponent:
    """``opponent``, or ``env_id``'s built-in one; a clear ConfigurationError for an unknown id or a game without."""
    if not isinstance(env_id, str) or env_id not in _registry():
        close = difflib.get_close_matches(str(env_id), list(_registry()), n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ConfigurationError(
            f"task.env_id={env_id!r} is not a textarena environment{hint}. Games with a built-in opponent: "
            f"{_with_opponent()}; every registered id: {LIST_GAMES}")
    if opponent is not None:
        return opponent
    game = _game_class(env_id)
    if game not in OPPONENTS:
        raise ConfigurationError(
            f"task.env_id={env_id!r} ({game}) has no built-in opponent: choose a game with one ({_with_opponent()}), "
            "or pass opponent= to TextArenaDataset (a function of the game state and a random.Random returning the "
            "opponent's move)")
    return OPPONENTS[game]


class TextArenaEnv(Env):
    """One game of ``env_id``: the model plays seat ``seat`` (0 moves first), ``opponent`` the other;
    ``instruction`` (if any) follows the game's first message to the model."""

    def __init__(self, env_id: str, tokenizer: Any, seed: int, seat: int, opponent: Opponent,
                 instruction: str = "") -> None:
        if seat not in (0, 1):
            raise ConfigurationError(f"seat={seat!r}: a two-player game has seats 0 (moves first) and 1")
        self.env_id, self.tokenizer, self.seed, self.seat, self.opponent = env_id, tokenizer, seed, seat, opponent
        self.instruction = instruction
        self.rng = random.Random(seed)  # the opponent's draws
        self.game: Any = None  # as textarena.make returns it: moves go through its action wrappers
        self.raw: Any = None
        self.messages: list[dict[str, str]] = []
        self.observation: list[int] = []
        self.moves = 0
        self._game_random: Any = None  # the state of the global `random` as the game last left it

    def initial_observation(self) -> list[int]:
        ta = _textarena()
        self.game = self._call("make", lambda: ta.make(self.env_id))
        self._call("reset", lambda: self.game.reset(num_players=2, seed=self.seed))
        self.raw = self.game  # without its wrappers: the game's messages, not a wrapper's rendering of them
        while isinstance(self.raw, ta.Wrapper):
            self.raw = self.raw.env
        if self._opponent_moves():
            raise RewardError(f"textarena {self.env_id} (game seed {self.seed}) ended before the model's first move")
        first = self._observe()
        self.messages = [{"role": "user", "content": f"{first}\n\n{self.instruction}" if self.instruction else first}]
        self.observation = list(self.tokenizer.encode(render_messages(self.messages, self.tokenizer),
                                                      add_special_tokens=False))
        return self.observation

    def step(self, action: list[int]) -> StepResult:
        if self.game is None:
            raise RewardError("TextArenaEnv.step before initial_observation")
        move = self.tokenizer.decode(action, skip_special_tokens=True)
        self.moves += 1
        done, _ = self._call("step", lambda: self.game.step(move))
        state = self.game.state
        invalid = (state.game_info[self.seat].get("invalid_move", False) if done
                   else getattr(state, "error_count", 0) > 0)  # refused, the model moves again
        metrics = {"invalid_move": float(invalid)}
        if not done:
            done = self._opponent_moves()
        if done:
            rewards, _ = self._call("close", self.game.close)
            if not rewards or self.seat not in rewards:
                raise RewardError(f"textarena {self.env_id} (game seed {self.seed}) ended without a reward for "
                                  f"seat {self.seat} (rewards: {rewards!r})")
            reward = float(rewards[self.seat])
            metrics.update(win=float(reward > 0), draw=float(reward == 0), loss=float(reward < 0),
                           moves=float(self.moves))
            return StepResult(reward=reward, done=True, metrics=metrics)
        self.messages = [*self.messages, {"role": "assistant", "content": move},
                         {"role": "user", "content": self._observe()}]
        self.observation = extend_conversation(self.observation + list(action), self.messages, self.tokenizer)
        return StepResult(reward=0.0, done=False, next_observation=self.observation, metrics=metrics)

    def _opponent_moves(self) -> bool:
        """The opponent moves until it is the model's turn or the game ends; returns whether it ended."""
        state = self.game.state
        for _ in range(OPPONENT_MOVES):
            if state.done or state.current_player_id == self.seat:
                return bool(state.done)
            move = self._call("the opponent's move", lambda: self.opponent(copy.deepcopy(state.game_state), self.rng))
            if not isinstance(move, str):
                raise RewardError(f"the opponent of textarena {self.env_id} returned {type(move).__name__}, not a str")
            self._call("step (the opponent's move)", lambda: self.game.step(move))  # noqa: B023 (called at once)
        raise RewardError(f"textarena {self.env_id} (game seed {self.seed}): the opponent made {OPPONENT_MOVES} moves "
                          "in a row without the game ending or passing the turn")

    def _observe(self) -> str:
        """The game's new messages to the model's seat as one user turn (its own moves are already its turns)."""
        player, messages = self._call("get_observation", self.raw.get_observation)
        if player != self.seat:
            raise RewardError(f"textarena {self.env_id}: expected seat {self.seat} to move, the game says {player}")
        ta = _textarena()
        names = self.game.state.role_mapping
        return "\n".join(f"[{names.get(sender, f'Player {sender}')}] {text}" for sender, text, kind in messages
                         if not (sender == self.seat and kind == ta.ObservationType.PLAYER_ACTION))

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        """``fn()`` inside the game, its failures a RewardError naming the game."""
        try:
            with self._own_random():
                return fn()
        except RewardError:
            raise
        except Exception as exc:
            raise RewardError(f"textarena {self.env_id} (game seed {self.seed}, seat {self.seat}) raised in {what}: "
                              f"{type(exc).__name__}: {exc}") from exc

    @contextlib.contextmanager
    def _own_random(self) -> Iterator[None]:
        """textarena seeds and draws from the global ``random`` (``State(seed=...)`` calls ``random.seed``): give
        each game its own stream, so a game replays from its seed whatever else ran, and the rest of the process
        keeps its own (not thread-safe against other threads drawing from the global ``random`` meanwhile)."""
        outer = random.getstate()
        if self._game_random is not None:
            random.setstate(self._game_random)
        try:
            yield
        finally:
            self._game_random = random.getstate()
            random.setstate(outer)


class TextArenaGroupBuilder(EnvGroupBuilder):
    """``group_size`` games of ``env_id`` with the same seed and seat."""

    def __init__(self, env_id: str, tokenizer: Any, seed: int, seat: int, opponent: Opponent,
                 group_size: int, instruction: str = "") -> None:
        self.env_id, self.tokenizer, self.seed, self.seat = env_id, tokenizer, seed, seat
        self.opponent, self.group_size, self.instruction = opponent, group_size, instruction

    def make_envs(self) -> list[Env]:
        return [TextArenaEnv(self.env_id, self.tokenizer, self.seed, self.seat, self.opponent, self.instruction)
                for _ in range(self.group_size)]


class TextArenaDataset(RLDataset):
    """Games of ``env_id`` in batches of ``games_per_batch`` groups of ``group_size``; ``test_games`` held-out games
    (one episode each, another seed stream). ``seat`` 0 or 1 fixes the model's seat; None alternates it game by game.
    ``instruction`` follows the game's first message (e.g. "Reply with only your move."). ``tokenizer`` may be left
    out when the loop supplies it (``bind_tokenizer``)."""

    def __init__(self, env_id: str, tokenizer: Any = None, games_per_batch: int = 4, group_size: int = 4,
                 num_batches: int = 1000, seed: int = 0, seat: int | None = None, opponent: Opponent | None = None,
                 test_games: int = 16, instruction: str = "") -> None:
        if games_per_batch < 1 or group_size < 1 or num_batches < 1 or test_games < 0:
            raise ConfigurationError("games_per_batch, group_size and num_batches must be at least 1, test_games at "
                                     f"least 0 (got {games_per_batch}, {group_size}, {num_batches}, {test_games})")
        if seat not in (None, 0, 1):
            raise ConfigurationError(f"task.seat={seat!r}: 0 (the model moves first), 1, or null (alternate)")
        self.opponent = resolve_opponent(env_id, opponent)
        self.env_id, self.tokenizer, self.seed, self.seat = env_id, tokenizer, seed, seat
        self.games_per_batch, self.group_size = games_per_batch, group_size
        self.num_batches, self.test_games, self.instruction = num_batches, test_games, instruction

    def __len__(self) -> int:
        return self.num_batches

    def bind_tokenizer(self, tokenizer: Any) -> None:
        if self.tokenizer is None:
            self.tokenizer = tokenizer

    def get_batch(self, index: int) -> list[EnvGroupBuilder]:
        return [self._group("train", i, self.group_size)
                for i in batch_positions(index, len(self), self.games_per_batch)]

    def test_groups(self) -> list[EnvGroupBuilder]:
        return [self._group("test", i, 1) for i in range(self.test_games)]

    def _group(self, split: str, index: int, group_size: int) -> TextArenaGroupBuilder:
        if self.tokenizer is None:
            raise ConfigurationError("TextArenaDataset has no tokenizer: pass tokenizer=, or hand the dataset to the "
                                     "loop, which binds its model's")
        game_seed = random.Random(f"{split}:{self.seed}:{index}").randrange(2**31)  # str seeds hash stably
        seat = self.seat if self.seat is not None else index % 2
        return TextArenaGroupBuilder(self.env_id, self.tokenizer, game_seed, seat, self.opponent, group_size,
                                     self.instruction)
