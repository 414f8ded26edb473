"""``rlvr.client``: the Tinker-shaped surface (names, parameters and async twins checked against the ``tinker`` SDK's
own classes), futures that are tinker ``APIFuture``s, calls that run in submission order, and errors that arrive
where the docstrings say. On the ``tiny`` model."""

from __future__ import annotations

import asyncio
import gc
import inspect
from concurrent.futures import Future
from types import MappingProxyType

import pytest
import tinker
import torch

import rlvr
from datums import ce_datum, rl_datum
from rlvr import client, types
from rlvr.engine import Engine
from rlvr.errors import ConfigurationError, SamplingError, UnknownLossError

PAIRS = [(rlvr.ServiceClient, tinker.ServiceClient), (rlvr.TrainingClient, tinker.TrainingClient),
         (rlvr.SamplingClient, tinker.SamplingClient)]
# rlvr additions the module documents as such: TrainingClient.parameters ("not part of Tinker's API"), the
# result / result_async that let a created client stand in for the future SDK >= 0.38 returns from creation, and
# ServiceClient.distributed_metrics (the loop's client protocol, rl/protocols.py: the Ray service's counters).
RLVR_ONLY = {"parameters", "result", "result_async", "sample_many", "sample_watched", "compute_topk_logprobs",
             "compute_topk_logprobs_async", "distributed_metrics"}
ADAM = types.AdamParams(learning_rate=5e-2)


def public_methods(cls: type) -> dict[str, object]:
    return {n: getattr(cls, n) for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))}


def shared_methods() -> list:
    return [pytest.param(ours, theirs, name, id=f"{ours.__name__}.{name}")
            for ours, theirs in PAIRS for name in sorted(public_methods(ours)) if name not in RLVR_ONLY]


def named_parameters(fn) -> dict[str, inspect.Parameter]:
    return {n: p for n, p in inspect.signature(fn).parameters.items()
            if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def positional(fn) -> list[str]:
    return [n for n, p in named_parameters(fn).items() if p.kind == p.POSITIONAL_OR_KEYWORD]


@pytest.fixture(scope="module")
def tc(service):
    return service.create_lora_training_client(base_model="tiny", rank=4, seed=41)


# -- the surface, against tinker's classes ----------------------------------------------------------------------------


def test_every_client_method_is_one_tinkers_class_has_under_that_name():
    for ours, theirs in PAIRS:
        missing = set(public_methods(ours)) - RLVR_ONLY - set(public_methods(theirs))
        assert not missing, f"{ours.__name__} has methods tinker.{theirs.__name__} lacks: {sorted(missing)}"


@pytest.mark.parametrize(("ours", "theirs", "name"), shared_methods())
def test_every_parameter_is_one_tinker_takes_with_the_same_default(ours, theirs, name):
    mine, tinkers = named_parameters(getattr(ours, name)), named_parameters(getattr(theirs, name))
    for param, spec in mine.items():
        assert param in tinkers, f"{ours.__name__}.{name}({param}=...) is not a parameter of tinker's"
        if spec.default is not spec.empty:
            assert spec.default == tinkers[param].default, (name, param)


def positional_cases() -> list:
    return [case for case in shared_methods()
            if case.values[2] not in ("optim_step", "optim_step_async")]  # tested on their own below


@pytest.mark.parametrize(("ours", "theirs", "name"), positional_cases())
def test_positional_arguments_mean_what_they_mean_in_tinker(ours, theirs, name):
    # A Tinker loop calling f(a, b) must reach the same parameters here; rlvr may take fewer.
    mine = positional(getattr(ours, name))
    assert mine == positional(getattr(theirs, name))[: len(mine)]


def test_optim_step_takes_tinkers_optim_params_keyword(service):
    tc = service.create_lora_training_client(base_model="tiny", rank=4, seed=43)
    tc.forward_backward([ce_datum([1, 2, 3])], "cross_entropy")
    assert tc.optim_step(optim_params=ADAM).result().metrics["grad_norm:mean"] > 0


def test_optim_step_takes_its_params_positionally_or_as_adam_params(tc):
    for call in (lambda: tc.optim_step(ADAM), lambda: tc.optim_step(adam_params=ADAM)):
        tc.forward_backward([ce_datum([1, 2, 3])], "cross_entropy")
        assert call().result().metrics["learning_rate:mean"] == ADAM.learning_rate


def test_optim_step_refuses_both_neither_and_other_optimizers(tc):
    tc.forward_backward([ce_datum([1, 2, 3])], "cross_entropy")
    for call, message in ((lambda: tc.optim_step(ADAM, adam_params=ADAM), "got both"),
                          (lambda: tc.optim_step(), "got neither"),
                          (lambda: tc.optim_step(types.DimuonParams(learning_rate=1e-3)), "takes types.AdamParams")):
        with pytest.raises(ConfigurationError, match=message):
            call()
    assert tc.optim_step(ADAM).result().metrics["grad_norm:mean"] > 0  # the gradients were kept


def test_a_state_loads_with_its_base_model_named_and_refuses_another(service, tmp_path):
    tc = service.create_lora_training_client(base_model="tiny", rank=4, seed=44)
    path = tc.save_state("named-base").result().path
    for create in (service.create_training_client_from_state,
                   service.create_training_client_from_state_with_optimizer):
        assert create(path, "tiny").get_info().model_data.model_name == "tiny"
        with pytest.raises(ConfigurationError, match="was trained on 'tiny'"):
            create(path, "smollm2-135m")


def test_existing_async_twins_are_coroutine_functions():
    for ours, _ in PAIRS:
        for name, fn in public_methods(ours).items():
            if name.endswith("_async") and name not in RLVR_ONLY:
                assert inspect.iscoroutinefunction(fn), f"{ours.__name__}.{name}"


def test_async_twins_take_their_sync_calls_parameters_and_are_annotated_as_tinkers():
    # A twin shows its sync call's parameters, name and docstring; what it returns is what tinker's twin returns:
    # the future for training calls, the client for create_*, the response itself for sample / compute_logprobs.
    for ours, theirs in PAIRS:
        for name, fn in public_methods(ours).items():
            if not name.endswith("_async") or name in RLVR_ONLY:
                continue
            sync = getattr(ours, name.removesuffix("_async"))
            mine = inspect.signature(fn)
            assert mine.parameters == inspect.signature(sync).parameters, f"{ours.__name__}.{name}"
            assert (fn.__name__, fn.__doc__) == (name, sync.__doc__)
            assert mine.return_annotation == inspect.signature(getattr(theirs, name)).return_annotation, name


def test_every_method_with_an_async_twin_in_tinker_has_one_here():
    missing = [f"{ours.__name__}.{name}_async" for ours, theirs in PAIRS for name in public_methods(ours)
               if name not in RLVR_ONLY and not name.endswith("_async")
               and hasattr(theirs, f"{name}_async") and not hasattr(ours, f"{name}_async")]
    assert not missing, missing


def test_service_client_takes_and_ignores_tinkers_connection_arguments(service):
    client = rlvr.ServiceClient(api_key="tml-unused", base_url="http://unused")
    assert client.engine is service.engine  # one engine per process, whatever the arguments
    names = [m.model_name for m in client.get_server_capabilities().supported_models]
    assert "tiny" in names


# -- futures ----------------------------------------------------------------------------------------------------------


def test_calls_return_tinker_api_futures_usable_sync_async_and_as_concurrent_futures(tc):
    datum = ce_datum([4, 5, 6, 7])
    future = tc.forward([datum], "cross_entropy")
    assert isinstance(future, tinker.APIFuture)
    value = future.result(timeout=60)
    assert isinstance(value, types.ForwardBackwardOutput)
    assert isinstance(future.future(), Future) and future.future().result() is value

    async def main():
        return await future, await future.result_async(), await future.coroutine()

    assert all(v is value for v in asyncio.run(main()))


def test_async_twins_return_what_their_sync_calls_return(service, tc):
    prompt = types.ModelInput.from_ints([1, 2, 3, 4])
    params = types.SamplingParams(max_tokens=3, seed=5)

    async def main():
        sampler = await tc.save_weights_and_get_sampling_client_async()
        forward = await (await tc.forward_async([ce_datum([1, 2, 3, 4])], "cross_entropy"))
        sample = await sampler.sample_async(prompt, 2, params)  # the response itself, as tinker's does
        logprobs = await sampler.compute_logprobs_async(prompt)
        info = await tc.get_info_async()
        return sampler, forward, sample, logprobs, info

    sampler, forward, sample, logprobs, info = asyncio.run(main())
    assert forward.loss_fn_outputs[0]["logprobs"].tolist() == logprobs[1:]
    again = sampler.sample(prompt, 2, params).result()  # same seed, same weights
    assert [s.tokens for s in sample.sequences] == [s.tokens for s in again.sequences]
    assert info == tc.get_info()


def test_created_clients_answer_result_and_await_with_themselves(service, tc):
    sampler = service.create_sampling_client(base_model="tiny")

    async def main():
        made = await service.create_sampling_client_async(base_model="tiny")
        return await tc, await sampler, await tc.result_async(), made, await made

    got_tc, got_sampler, again, made, made_again = asyncio.run(main())
    assert got_tc is tc and again is tc and tc.result() is tc and tc.result(timeout=1) is tc
    assert got_sampler is sampler and sampler.result() is sampler
    assert isinstance(made, rlvr.SamplingClient) and made_again is made


# -- ordering ---------------------------------------------------------------------------------------------------------


def test_calls_submitted_before_any_is_awaited_run_as_if_each_was_awaited_in_turn(service):
    datum = ce_datum([3, 1, 4, 1, 5, 9, 2, 6])
    lps = lambda out: out.loss_fn_outputs[0]["logprobs"].tolist()  # noqa: E731

    eager = service.create_lora_training_client(base_model="tiny", rank=4, seed=42)
    futures = [eager.forward([datum], "cross_entropy"), eager.forward_backward([datum], "cross_entropy"),
               eager.optim_step(ADAM), eager.save_weights_for_sampler("after-one-step"),
               eager.forward([datum], "cross_entropy")]
    before, _, _, saved, after = (f.result(timeout=60) for f in futures)

    stepwise = service.create_lora_training_client(base_model="tiny", rank=4, seed=42)
    want_before = lps(stepwise.forward([datum], "cross_entropy").result())
    stepwise.forward_backward([datum], "cross_entropy").result()
    stepwise.optim_step(ADAM).result()
    want_after = lps(stepwise.forward([datum], "cross_entropy").result())

    assert lps(before) == want_before and lps(after) == want_after and want_after != want_before
    # The sampler weights were saved after the step and before the last forward: they are the stepped weights.
    sampler = service.create_sampling_client(model_path=saved.path)
    assert sampler.compute_logprobs(types.ModelInput.from_ints([3, 1, 4, 1, 5, 9, 2, 6])).result()[1:] == want_after


# -- errors -----------------------------------------------------------------------------------------------------------


def test_a_failing_request_fails_on_its_future_and_the_next_one_still_runs(tc):
    bad = tc.forward_backward([ce_datum([1, 2, 3])], "reinforce")  # no exception at call time...
    good = tc.forward([ce_datum([1, 2, 3])], "cross_entropy")  # ...and this one is queued behind it
    with pytest.raises(UnknownLossError, match="'reinforce' is not a built-in loss"):
        bad.result(timeout=60)
    assert good.result(timeout=60).metrics["loss:sum"] > 0


def test_unsupported_and_missing_arguments_are_refused_by_name(service, tc):
    sampler = service.create_sampling_client(base_model="tiny")
    with pytest.raises(SamplingError, match="prompt_logprobs_last_n=1 needs include_prompt_logprobs=True"):
        sampler.sample(types.ModelInput.from_ints([1, 2]), 1, types.SamplingParams(max_tokens=1),
                       prompt_logprobs_last_n=1).result()
    with pytest.raises(SamplingError, match="model_path .* or base_model"):
        service.create_sampling_client()
    with pytest.raises(ConfigurationError, match="rank must be a positive integer, got 0"):
        service.create_lora_training_client(base_model="tiny", rank=0)
    with pytest.raises(ConfigurationError, match="nothing would train"):
        service.create_lora_training_client(base_model="tiny", train_mlp=False, train_attn=False, train_unembed=False)


# -- what each call gives back ----------------------------------------------------------------------------------------


def test_get_info_describes_the_adapter(tc):
    info = tc.get_info()
    assert isinstance(info, types.GetInfoResponse)
    assert info.model_id == tc.model_id and info.is_lora and info.lora_rank == 4
    assert info.model_name == info.model_data.model_name == "tiny" and info.model_data.arch == "llama"


def test_loss_config_may_be_any_mapping(tc):
    datum = rl_datum([1, 2], [3, 4], [-1.0, -1.0], 1.0)
    config = MappingProxyType({"clip_low_threshold": 0.9, "clip_high_threshold": 1.1})
    out = tc.forward([datum], "ppo", config).result()
    assert set(out.metrics) == {"loss:sum", "clip_fraction:mean"}


def test_custom_loss_gets_one_differentiable_logprob_per_target_token(tc):
    data = [ce_datum([1, 2, 3, 4]), ce_datum([5, 6, 7, 8, 9, 10])]
    seen = []

    def loss_fn(got_data, logprobs_list):
        seen.append((got_data, [(lp.shape, lp.requires_grad, lp.detach().tolist()) for lp in logprobs_list]))
        return -sum(lp.sum() for lp in logprobs_list), {"calls:sum": 1.0}

    out = tc.forward_backward_custom(data, loss_fn).result()
    tc.optim_step(types.AdamParams(learning_rate=0.0)).result()  # clear the gradient for the other tests
    got_data, shapes = seen[0]
    assert list(got_data) == data
    assert [s for s, _, _ in shapes] == [torch.Size([3]), torch.Size([5])]
    assert all(grad for _, grad, _ in shapes)
    assert [v for _, _, v in shapes] == [o["logprobs"].tolist() for o in out.loss_fn_outputs]
    assert out.metrics["calls:sum"] == 1.0


def test_sample_gives_each_sequence_a_logprob_per_token_and_a_stop_reason(service, tc):
    sampler = tc.save_weights_and_get_sampling_client()
    prompt = types.ModelInput.from_ints([7, 8, 9, 10])
    resp = sampler.sample(prompt, 3, types.SamplingParams(max_tokens=5, seed=1),
                          include_prompt_logprobs=True).result(timeout=60)
    assert len(resp.sequences) == 3
    for seq in resp.sequences:
        assert 1 <= len(seq.tokens) == len(seq.logprobs) <= 5
        assert seq.stop_reason in ("stop", "length")
        assert seq.stop_reason == "stop" or len(seq.tokens) == 5  # "length": max_tokens reached
        assert all(lp <= 0 for lp in seq.logprobs)
    assert resp.prompt_logprobs == sampler.compute_logprobs(prompt).result()
    assert sampler.get_base_model() == "tiny" and sampler.get_tokenizer() is tc.get_tokenizer()


def test_a_sampling_client_frees_its_snapshot_once_garbage_collected(tc):
    engine = tc.engine
    sampler = tc.save_weights_and_get_sampling_client()
    path = sampler.model_path
    assert path in engine._snapshots
    del sampler
    gc.collect()
    engine.run(lambda: None)  # the release is queued on the engine thread; let it run
    assert path not in engine._snapshots


def test_a_training_client_frees_its_adapter_once_garbage_collected_and_its_samplers_sample_on(tc):
    """A dropped TrainingClient's adapter and optimizer leave the model (a server's clients come and go; each one
    kept would cost memory and slow every adapter switch); a SamplingClient taken from it is a copy and samples on,
    the same tokens as before."""
    service = tc.service
    dropped = service.create_lora_training_client("tiny", rank=4, seed=3)
    host, adapter = dropped._trainer.host, dropped._trainer.adapter
    sampler = dropped.save_weights_and_get_sampling_client()
    prompt, params = types.ModelInput.from_ints([7, 8, 9, 10]), types.SamplingParams(max_tokens=5, seed=1)
    def drawn() -> list:
        return [(s.tokens, s.logprobs) for s in sampler.sample(prompt, 2, params).result(timeout=60).sequences]

    before = drawn()
    assert adapter in host.specs
    del dropped
    gc.collect()
    tc.engine.run(lambda: None)  # the release is queued on the engine thread; let it run
    assert adapter not in host.specs
    assert not any(f".{adapter}." in name for name, _ in host.peft.named_parameters())
    assert drawn() == before


def test_parameters_are_copies_keyed_without_the_adapter_name(tc):
    params = tc.parameters()
    adapter = tc._trainer.adapter
    assert params and not any(f".{adapter}." in k for k in params)
    next(iter(params.values())).add_(1.0)
    assert all(torch.equal(v, tc.parameters()[k]) for k, v in tc.parameters().items())
    assert not torch.equal(next(iter(params.values())), next(iter(tc.parameters().values())))


# -- the constructor: precision, an engine of one's own, Tinker's connection settings --------------------------


def test_precision_picks_the_shared_engine_and_is_checked_against_it():
    shared = Engine.default()
    assert rlvr.ServiceClient().engine is shared
    assert rlvr.ServiceClient(precision=shared.precision).engine is shared
    other = "bfloat16" if shared.precision == "float32" else "float32"
    # One engine per process: no silent switch (on a CPU without bfloat16 products, refused as unsupported first).
    with pytest.raises(ConfigurationError, match=f"precision(='| ){other}"):
        rlvr.ServiceClient(precision=other)
    with pytest.raises(ConfigurationError, match=r"precision='fp16': choose one of"):
        rlvr.ServiceClient(precision="fp16")


def test_an_engine_of_ones_own_is_kept_and_must_agree_with_precision():
    own = Engine(precision="float32")
    assert rlvr.ServiceClient(own).engine is own
    assert rlvr.ServiceClient(engine=own, precision="float32").engine is own
    with pytest.raises(ConfigurationError, match=r"precision='bfloat16'\): that engine multiplies in float32"):
        rlvr.ServiceClient(engine=own, precision="bfloat16")


def test_tinkers_connection_settings_are_ignored():
    service = rlvr.ServiceClient(api_key="tml-unused", base_url="http://localhost:1")
    assert service.engine is Engine.default()


def test_the_exported_lora_alpha_is_the_adapters(service):
    tc = service.create_lora_training_client(base_model="tiny", rank=4, seed=0)
    trainer = tc._trainer
    assert trainer.host.peft_config(trainer.adapter).lora_alpha == client.LORA_ALPHA == 32


def test_a_runs_precision_is_the_one_asked_for_else_the_models_default_on_this_cpu(tmp_path, monkeypatch):
    from rlvr.engine.cpu import packed
    from rlvr.engine.models.load import linear_parameters
    from rlvr.engine.models.random_models import real_config

    folder = tmp_path / "qwen2.5-0.5b"
    real_config("qwen2.5-0.5b").save_pretrained(folder)  # its config alone: the size is read, nothing loads
    # 24 layers x (896 x (2 x 896 + 2 x 128) for q, k, v, o + 3 x 896 x 4864 for the MLP) + 151,936 x 896
    assert linear_parameters(str(folder)) == 24 * (896 * (2 * 896 + 2 * 128) + 3 * 896 * 4864) + 151_936 * 896
    assert linear_parameters("tiny") == 0
    assert linear_parameters(str(tmp_path)) is None  # no config.json there
    monkeypatch.delenv("RLVR_PRECISION", raising=False)
    monkeypatch.setenv("RLVR_DEVICE", "cpu")
    monkeypatch.setattr(packed, "native_bfloat16", lambda: True)
    existing = Engine.default()  # this process's engine, in float32 (RLVR_PRECISION is unset)
    assert client.run_precision(None, str(folder)) == existing.precision == "float32"  # one engine a process
    monkeypatch.setattr(Engine, "_default", None)  # as in a fresh process
    assert client.run_precision(None, str(folder)) == "bfloat16"
    assert client.run_precision(None, "tiny") == "float32"
    assert client.run_precision("float32", str(folder)) == "float32"  # asked for: always wins
    monkeypatch.setenv("RLVR_PRECISION", "float32")
    assert client.run_precision(None, str(folder)) == "float32"
    monkeypatch.delenv("RLVR_PRECISION")
    monkeypatch.setattr(packed, "native_bfloat16", lambda: False)
    assert client.run_precision(None, str(folder)) == "float32"  # a CPU that would only emulate it
