"""The C heap's settings (``cpu/heap.py``), in fresh interpreters (they are process-wide): a large block freed and
allocated again reuses its pages instead of faulting fresh ones in, ``release_free_pages`` hands them back,
``RLVR_HEAP=system`` keeps glibc's defaults (the control), a bad value is refused; and a CPU engine releases the
free pages after loading a model and after each call."""

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the settings are glibc's")

PROBE = """
import json, resource, threading, torch
from rlvr.engine.cpu import heap

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

def resident_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

def refaults(out):
    for _ in range(3):  # the heap grows to hold the block and settles
        block = torch.ones(32 << 20)  # 128 MB: over glibc's largest mmap threshold (32 MB)
        del block
    before = faults()
    block = torch.ones(32 << 20)
    out.append(faults() - before)

kept = heap.keep_freed_blocks()
measured = []
thread = threading.Thread(target=refaults, args=(measured,))  # started after, as the engine's worker thread is
thread.start()
thread.join()
held = resident_mb()
heap.release_free_pages()
print(json.dumps({"kept": kept, "refaults": measured[0], "released_mb": held - resident_mb()}))
"""


def run_probe(setting: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RLVR_HEAP"}
    if setting is not None:
        env["RLVR_HEAP"] = setting
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)


def probe(setting: str | None) -> dict:
    out = run_probe(setting)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_freed_large_block_is_reused_without_page_faults_and_released_after():
    kept = probe(None)
    assert kept["kept"] is True
    assert kept["refaults"] < 2_000  # 128 MB is 32,768 pages: next to none faulted in again
    assert kept["released_mb"] > 100  # freed, it stayed in the heap until release_free_pages gave it back


def test_with_the_systems_defaults_every_large_block_faults_its_pages_in_again():
    system = probe("system")  # the control: what the settings save
    assert system["kept"] is False
    assert system["refaults"] > 30_000
    assert system["released_mb"] < 20  # nothing was held: unmapped when freed


def test_a_bad_setting_is_refused_naming_the_choices():
    out = run_probe("big")
    assert out.returncode != 0
    assert "RLVR_HEAP='big': use 'reuse'" in out.stderr and "'system'" in out.stderr


def test_a_cpu_engine_releases_the_free_pages_after_loading_and_after_each_forward(monkeypatch):
    from datums import ce_datum
    from rlvr.engine.cpu import heap
    from rlvr.engine.engine import Engine
    from rlvr.engine.models.lora import LoraSpec

    calls = []
    monkeypatch.setattr(heap, "release_free_pages", lambda: calls.append(1))
    engine = Engine()
    trainer = engine.run(engine.create_trainer, "tiny", LoraSpec(rank=4), 0)
    assert len(calls) == 1  # after loading the model
    for backward in (False, True):
        engine.run(engine.forward, trainer, [ce_datum([1, 2, 3, 4])], "cross_entropy", None, backward)
    assert len(calls) == 3
