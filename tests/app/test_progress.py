"""app/progress.py: off a terminal, a step phase prints its start, a line at least ``every_s`` apart and its last step,
with seconds per step and ETA from the steps this process ran (the first step's one-off work left out, or said);
evaluations show the problems answered; on a terminal it draws bars and prints no lines; off a terminal nothing is
wrapped."""

from __future__ import annotations

import io

from rich.console import Console

from rlvr.app.progress import StepProgress, make_console


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=200), out


def test_off_a_terminal_lines_come_at_start_every_30_s_and_at_the_end_with_rate_and_eta():
    console, out = _console(terminal=False)
    clock = Clock()
    with StepProgress(console, "warm-up step", 10, status="starting", clock=clock) as progress:
        for step in range(10):
            clock.now += 12.0  # a step takes 12 s
            progress.update(step + 1, f"loss {step}")
    lines = out.getvalue().splitlines()
    assert lines == [
        "warm-up step 0/10  starting  elapsed 0:00",
        "warm-up step 3/10  loss 2  12.0 s/step  elapsed 0:36  ETA 1:24",   # 36 s after the last line
        "warm-up step 6/10  loss 5  12.0 s/step  elapsed 1:12  ETA 0:48",
        "warm-up step 9/10  loss 8  12.0 s/step  elapsed 1:48  ETA 0:12",
        "warm-up step 10/10  loss 9  12.0 s/step  elapsed 2:00  ETA 0:00",  # the last step, whenever it comes
    ]


def test_a_resumed_phase_times_only_the_steps_this_process_ran():
    console, out = _console(terminal=False)
    clock = Clock()
    with StepProgress(console, "step", 100, start=40, clock=clock, every_s=0) as progress:
        clock.now += 3600 * 2 + 5
        progress.update(50, "reward 0.5")
    assert out.getvalue().splitlines()[-1] == "step 50/100  reward 0.5  720.5 s/step  elapsed 2:00:05  ETA 10:00:25"


def test_on_a_terminal_a_bar_and_no_step_lines():
    console, out = _console(terminal=True)
    with StepProgress(console, "step", 3) as progress:
        for step in range(3):
            progress.update(step + 1, "reward 1.0")
    assert "step 3/3" in out.getvalue() and "s/step" not in out.getvalue()


def test_the_first_step_alone_gives_no_rate_and_says_it_holds_the_set_up():
    console, out = _console(terminal=False)
    clock = Clock()
    with StepProgress(console, "step", 10, clock=clock, every_s=0) as progress:
        clock.now += 100.0  # loading the model and the first step
        progress.update(1, "a")
        clock.now += 10.0
        progress.update(2, "b")
    assert out.getvalue().splitlines()[1:] == ["step 1/10  a  first step 100.0 s (with set-up; ETA from the next)  "
                                               "elapsed 1:40",
                                               "step 2/10  b  10.0 s/step  elapsed 1:50  ETA 1:20"]


def test_an_evaluation_inside_a_phase_shows_problems_answered_and_is_left_out_of_the_step_time():
    console, out = _console(terminal=False)
    clock = Clock()
    with StepProgress(console, "step", 10, clock=clock, every_s=0) as progress:
        with progress.evaluation("evaluating the baseline", 32) as answered:
            clock.now += 40.0
            answered(16)
            clock.now += 40.0
            answered(32)
        clock.now += 12.0
        progress.update(1, "a")
    assert out.getvalue().splitlines() == [
        "step 0/10  elapsed 0:00",
        "evaluating the baseline: answered 0/32  elapsed 0:00",
        "evaluating the baseline: answered 16/32  2.5 s/problem  elapsed 0:40  ETA 0:40",  # a batch of answers
        "evaluating the baseline: answered 32/32  2.5 s/problem  elapsed 1:20  ETA 0:00",
        "step 1/10  a  first step 12.0 s (with set-up; ETA from the next)  elapsed 1:32",
    ]


def test_on_a_terminal_the_eta_survives_steps_longer_than_30_s_and_evaluations_get_a_bar():
    console, _ = _console(terminal=True)
    clock = Clock()
    with StepProgress(console, "step", 10, clock=clock) as progress:
        with progress.evaluation("evaluating the baseline", 4) as answered:
            answered(4)
            assert "evaluating the baseline: answered 4/4" in _rendered(progress)
        for step in range(3):
            clock.now += 40.0  # rich's default estimate forgets samples older than 30 s: no ETA at all
            progress.update(step + 1, "r")
        assert "0:04:40" in _rendered(progress)  # 7 steps left at 40 s, timed from the first step's end


def _rendered(progress: StepProgress) -> str:
    render = io.StringIO()
    Console(file=render, width=200, force_terminal=False).print(progress._bar.get_renderable())
    return render.getvalue()


def test_off_a_terminal_the_run_console_wraps_no_line(capsys):
    path = "runs/" + "a-rather-long-run-folder-name/" * 8 + "step-000010"
    make_console().print(f"run folder: {path}   resume with: rlvr resume {path}")
    assert capsys.readouterr().out == f"run folder: {path}   resume with: rlvr resume {path}\n"
    plain = Console(file=io.StringIO())  # rich's own default off a terminal: 80 columns, wrapped
    plain.print(f"run folder: {path}")
    assert len(plain.file.getvalue().splitlines()) > 1


def test_the_clipped_warning_starts_above_a_quarter_and_names_the_fix():
    from rlvr.app.progress import ClippedWatch, clipped_warning

    assert clipped_warning(0.25, 200, "the answers") is None and clipped_warning(None, 200, "the answers") is None
    assert clipped_warning(0.61, 200, "the answers") == (
        "warning: 61% of the answers hit max_tokens=200 and were cut off; their rewards judge unfinished answers. "
        "Raise the budget, e.g. max_tokens=400")
    console, out = _console(terminal=False)
    watch = ClippedWatch(console, 16)
    for share in (0.1, 0.5, 0.9):
        watch.check("train", share, "the training answers")
    watch.check("held-out", 0.3, "the held-out answers")
    assert out.getvalue().splitlines() == [
        "warning: 50% of the training answers hit max_tokens=16 and were cut off; their rewards judge unfinished "
        "answers. Raise the budget, e.g. max_tokens=32",
        "warning: 30% of the held-out answers hit max_tokens=16 and were cut off; their rewards judge unfinished "
        "answers. Raise the budget, e.g. max_tokens=32"]
