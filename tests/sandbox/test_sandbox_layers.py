"""Layer reporting (doctor, CLI, warn-once) and what still holds when a layer is missing."""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING

import pytest

from rlvr.sandbox import Sandbox, doctor, format_doctor_report
from rlvr.sandbox import executor as executor_module
from rlvr.sandbox.__main__ import main
from rlvr.sandbox.doctor import doctor_ok

if TYPE_CHECKING:
    from conftest import HostUnixSockets

LAYERS = ("landlock", "seccomp", "privileges", "bwrap", "rlimits", "pidfd", "subreaper")
PROBES = ("probe.filesystem", "probe.process", "probe.network", "probe.unix", "probe.signal", "probe.memory",
          "probe.uid")


@pytest.fixture(scope="module")
def report() -> dict[str, str]:
    return doctor()


def test_doctor_reports_every_layer_and_probe(report: dict[str, str]) -> None:
    for key in ("python", "kernel", *LAYERS, *PROBES, "verdict"):
        assert key in report, key
    for key in LAYERS:
        assert report[key].startswith(("active:", "missing:")), report[key]


def test_doctor_probes_agree_with_the_active_layers(report: dict[str, str]) -> None:
    def active(layer: str) -> bool:
        return report[layer].startswith("active")

    assert report["probe.memory"].startswith("blocked")
    if active("landlock") or active("bwrap"):
        assert report["probe.filesystem"].startswith("blocked"), report["probe.filesystem"]
    if active("seccomp"):
        for probe in ("probe.process", "probe.network", "probe.unix", "probe.signal"):
            assert report[probe].startswith("blocked"), report[probe]
    if os.geteuid() == 0 and active("privileges"):
        assert report["probe.uid"].startswith("blocked")


def test_format_doctor_report_lists_every_key(report: dict[str, str]) -> None:
    text = format_doctor_report(report)
    assert text.startswith("rlvr sandbox doctor")
    for key, value in report.items():
        assert key in text and value in text


def test_cli_doctor_prints_the_report_and_exits_by_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["doctor"])
    out = capsys.readouterr().out
    assert "landlock" in out and "verdict" in out
    assert status in (0, 1)
    assert (status == 0) == ("WEAK" not in out and "cannot" not in out.split("verdict")[1])


def test_doctor_ok_reads_the_verdict() -> None:
    assert doctor_ok({"verdict": "all layers active and every probe blocked"})
    assert not doctor_ok({"verdict": "WEAK: probe.process not blocked"})
    assert not doctor_ok({"sandbox": "cannot start", "verdict": "the sandbox cannot run here"})


def test_a_missing_layer_warns_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(executor_module, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            with Sandbox(num_workers=1, use_landlock=False, use_bwrap=False) as pool:
                assert pool.layers["landlock"]["active"] is False
    landlock_warnings = [w for w in caught if "landlock is not active" in str(w.message)]
    assert len(landlock_warnings) == 1
    assert issubclass(landlock_warnings[0].category, RuntimeWarning)


def test_without_landlock_seccomp_and_the_uid_still_contain() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pool = Sandbox(num_workers=1, timeout=2.0, use_landlock=False, use_bwrap=False)
    with pool:
        result = pool.run("import os, socket", [
            "os.fork()",
            "socket.create_connection(('127.0.0.1', 9), timeout=0.5)",
            "os.kill(os.getppid(), 0)",
        ])
        assert result.num_passed == 0, result.stderr_tail
        assert pool.run("x = 1", ["assert x == 1"]).passed


def test_without_landlock_seccomp_keeps_host_unix_sockets_out(host_unix_sockets: HostUnixSockets) -> None:
    """Kernels without Landlock (or before ABI 6, which scopes abstract sockets): seccomp alone must hold."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pool = Sandbox(num_workers=1, timeout=2.0, use_landlock=False, use_bwrap=False)
    with pool:
        if not pool.layers["seccomp"]["active"]:
            pytest.skip(f"seccomp is not active here: {pool.layers['seccomp']['detail']}")
        code = "import socket\ndef connect(address):\n    socket.socket(socket.AF_UNIX).connect(address)\n"
        result = pool.run(code, [f"connect({host_unix_sockets.stream_path!r})",
                                 f"connect({host_unix_sockets.abstract_name!r})"])
        assert host_unix_sockets.arrivals() == []
        assert result.num_passed == 0, result.stderr_tail


def test_without_seccomp_forks_are_capped_and_leftovers_swept() -> None:
    """Seccomp off: RLIMIT_NPROC caps forks (where meaningful), and the subreaper kills what a job leaves."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pool = Sandbox(num_workers=1, timeout=3.0, use_seccomp=False, max_processes=16, use_bwrap=False)
    with pool:
        if "processes=" not in pool.layers["rlimits"]["detail"]:
            pytest.skip("RLIMIT_NPROC is not meaningful here (root without a privilege drop)")
        # Linear, not exponential: only the job forks, so even without the limit this makes 200 sleepers.
        code = (
            "import os, time\n"
            "forked = 0\n"
            "for _ in range(200):\n"
            "    try:\n"
            "        pid = os.fork()\n"
            "    except OSError:\n"
            "        break\n"
            "    if pid == 0:\n"
            "        os.setsid()\n"  # leave the job's process group, so only the subreaper sweep can find it
            "        print('child', os.getpid(), flush=True)\n"
            "        time.sleep(60)\n"
            "        os._exit(0)\n"
            "    forked += 1\n"
        )
        result = pool.run(code, ["assert forked < 40"])
        assert result.passed, result.stderr_tail
        children = [int(line.split()[1]) for line in result.stdout_tail.splitlines() if line.startswith("child")]
        assert children, result.stdout_tail
        alive = [pid for pid in children if os.path.exists(f"/proc/{pid}")]
        assert not alive, f"leftover processes survived the job: {alive}"
        assert pool.run("x = 1", ["assert x == 1"]).passed
