"""The public surface: sorted exports that exist, and Tinker's own types under rlvr.types."""

import tinker

import rlvr
from rlvr import client


def test_exports_are_sorted_and_exist():
    for module in (rlvr, client):
        assert module.__all__ == sorted(module.__all__)
        assert all(hasattr(module, name) for name in module.__all__)


def test_types_are_tinkers_own():
    for name in ("Datum", "ModelInput", "TensorData", "SamplingParams", "AdamParams", "SampleResponse",
                 "ForwardBackwardOutput"):
        assert getattr(rlvr.types, name) is getattr(tinker.types, name)


def test_client_methods_are_spelled_as_in_tinker():
    for ours, theirs in ((rlvr.ServiceClient, tinker.ServiceClient), (rlvr.TrainingClient, tinker.TrainingClient),
                         (rlvr.SamplingClient, tinker.SamplingClient)):
        ours_names = {n for n in dir(ours) if not n.startswith("_")}
        wanted = {
            rlvr.ServiceClient: {"create_lora_training_client", "create_training_client_from_state",
                                 "create_training_client_from_state_with_optimizer", "create_sampling_client"},
            rlvr.TrainingClient: {"forward", "forward_backward", "forward_backward_custom", "optim_step",
                                  "save_state", "load_state", "load_state_with_optimizer", "save_weights_for_sampler",
                                  "save_weights_and_get_sampling_client", "get_info", "get_tokenizer"},
            rlvr.SamplingClient: {"sample", "sample_async", "compute_logprobs", "get_tokenizer", "get_base_model"},
        }[ours]
        assert wanted <= ours_names
        assert wanted <= {n for n in dir(theirs) if not n.startswith("_")}
