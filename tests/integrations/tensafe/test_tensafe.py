"""The TenSafe cookbook's complete RLVR script runs with only its imports changed (and its 8B model swapped for
tiny, since no hub is reachable), read from ../shared/seeds at test time."""

import re
from pathlib import Path

import pytest

from rlvr.errors import ConfigurationError
from rlvr.integrations.tensafe import LoRAConfig, ServiceClient, TrainingConfig

SEEDS = Path(__file__).resolve().parents[4] / "shared" / "seeds"


def complete_script() -> str:
    if not SEEDS.is_dir():
        pytest.skip(f"seed documents not found at {SEEDS}")
    for path in sorted(SEEDS.glob("*.txt")):
        text = path.read_text()
        if "Cookbook: RLVR Training" in text:
            section = text.split("## Step 7: Complete RLVR Script", 1)[1]
            return re.search(r"```python\n(.*?)```", section, re.S).group(1)
    pytest.skip("the TenSafe RLVR cookbook is not among the seeds")


@pytest.mark.slow
def test_complete_script_runs_with_imports_changed(tmp_path, monkeypatch):
    script = complete_script()
    script = script.replace("from tg_tinker import", "from rlvr.integrations.tensafe import")
    script = script.replace("from tensafe.rlvr import", "from rlvr.integrations.tensafe import")
    script = script.replace('"meta-llama/Llama-3-8B"', '"tiny"')  # no hub here: the one non-import change
    assert "tg_tinker" not in script and "tensafe.rlvr" not in script
    printed = []
    scope = {"__name__": "__main__", "print": lambda *a, **k: printed.append(" ".join(map(str, a)))}
    exec(compile(script, "tensafe_complete_script.py", "exec"), scope)
    assert printed[-1] == "Training complete!"
    assert any(line.startswith("New best! Reward:") and "Checkpoint: rlvr://" in line for line in printed)


def test_checkpoint_id_resumes_and_alpha_is_checked():
    service = ServiceClient()
    tc = service.create_training_client(TrainingConfig(model_ref="tiny", lora_config=LoRAConfig(rank=4), seed=0))
    checkpoint = tc.save_state(metadata={"epoch": 3})
    assert checkpoint.artifact_id.startswith("rlvr://") and checkpoint.metadata == {"epoch": 3}
    again = service.create_training_client(TrainingConfig(model_ref="tiny"), checkpoint_id=checkpoint.artifact_id)
    assert again.parameters().keys() == tc.parameters().keys()
    with pytest.raises(ConfigurationError, match="alpha=16"):
        service.create_training_client(TrainingConfig(model_ref="tiny", lora_config=LoRAConfig(alpha=16)))
