"""A walk over every public method of the installed tinker SDK's four clients (``ServiceClient``, ``TrainingClient``,
``SamplingClient``, ``RestClient``, sync and ``_async`` twins alike) against ``rlvr serve`` on ``tiny``.

The method list is read from the installed SDK with ``inspect`` (``test_walk_table_covers_the_sdk``), so a method a
newer SDK adds fails the walk until a row here says what it does. Each row is a call recipe and its outcome:

* ``Works(check)``: the call succeeds and ``check`` holds; where it returns numbers (losses, logprobs, gradient norms,
  samples) they equal the in-process ``rlvr.ServiceClient``'s for the same call on the same weights. The in-process
  twins (``Walk.local``, ``Walk.local_sampler``) are kept in step with the remote ones: every call that changes the
  remote weights or pending gradients is made on the local twin too.
* ``Refused(pattern)``: the call raises, and the message names the method and the reason.

After every row, one cheap call on the same client must come back within ``PROMPT_S``: a refusal or a success must
not leave a ``seq_id`` gap, a half-open session or a retry loop behind it.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest
import tinker
import torch
from tinker import types
from tinker.lib.api_future_impl import QueueState
from tinker.lib.public_interfaces.api_future import APIFuture

from rlvr.home import checkpoint_root

PROMPT_S = 1.0
"""How soon the next call on a client must return after any row, beyond twice the time of the same call made right
after it (so that a machine busy with other work does not fail the walk): one forward on tiny over loopback HTTP
takes tens of milliseconds; a seq_id left open would add the server's gap timeout (10 s), a retried refusal the SDK's
backoff (seconds)."""

SEED = 4321
PROMPT = [72, 101, 108, 108, 111, 32]
TOKENS = PROMPT + [119, 111, 114, 108, 100, 33]
N = len(TOKENS) - 1


def _datum(shift: float) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(TOKENS[:-1]), loss_fn_inputs={
        "target_tokens": types.TensorData(data=TOKENS[1:], dtype="int64"),
        "weights": types.TensorData(data=[0.0] * 4 + [1.0] * (N - 4), dtype="float32"),
        "logprobs": types.TensorData(data=[-5.0 + shift + 0.1 * i for i in range(N)], dtype="float32"),
        "advantages": types.TensorData(data=[0.0] * 4 + [1.0 - shift] * (N - 4), dtype="float32")})


def _keep(data: list[types.Datum], keys: tuple[str, ...]) -> list[types.Datum]:
    return [types.Datum(model_input=d.model_input, loss_fn_inputs={k: d.loss_fn_inputs[k] for k in keys})
            for d in data]


DATA = _keep([_datum(0.0), _datum(0.5)], ("target_tokens", "logprobs", "advantages"))  # importance_sampling's
CE_DATA = _keep([_datum(0.0), _datum(0.5)], ("target_tokens", "weights"))  # cross_entropy's
ADAM = types.AdamParams(learning_rate=5e-3)
PARAMS = types.SamplingParams(max_tokens=6, temperature=1.0, seed=9)


def neg_ll(data: list[types.Datum], logprobs_list: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
    """A custom loss (the SDK's CustomLossFnV1 signature, which rlvr's in-process client takes too)."""
    loss = sum(-(lp * d.loss_fn_inputs["weights"].to_torch()).sum() for d, lp in zip(data, logprobs_list, strict=True))
    return loss, {"neg_ll:sum": float(loss.detach())}


def per_datum_neg_ll(logprobs: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
    """The same loss as ``create_custom_loss`` takes it: per datum, named inputs."""
    loss = -(logprobs * weights).sum()
    return loss, {"custom/neg_ll:sum": loss}


def _close(a: Any, b: Any, what: str) -> None:
    np.testing.assert_allclose(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), rtol=1e-5,
                               atol=1e-6, err_msg=what)


@dataclass
class Walk:
    """The clients a row works on: the SDK's against the server, and their in-process twins in step with them."""

    server: Any
    sdk: tinker.ServiceClient
    rest: tinker.RestClient
    service: Any  # rlvr.ServiceClient behind the server (it shares the server's checkpoint folder)
    tc: tinker.TrainingClient
    local: Any  # rlvr.TrainingClient twin of tc
    state_path: str  # tc's save_state checkpoint
    sampler_path: str  # tc's sampler checkpoint
    sc: tinker.SamplingClient  # on sampler_path
    local_sampler: Any  # rlvr.SamplingClient on sampler_path
    names: itertools.count

    @property
    def session_id(self) -> str:
        return self.tc.model_id.split(":")[0]

    def name(self, prefix: str) -> str:
        return f"{prefix}-{next(self.names)}"


@pytest.fixture(scope="module")
def hub_offline() -> Any:
    """The hub in offline mode for the walk: this machine cannot reach it, and a lookup that would retry a
    connection for ~45 s then fails at once, as it does for a user who sets HF_HUB_OFFLINE=1."""
    import huggingface_hub.constants

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        yield


@pytest.fixture(scope="module")
def walk(server, sdk, service, hub_offline) -> Walk:
    tc = sdk.create_lora_training_client(base_model="tiny", rank=4, seed=SEED).result()
    local = service.create_lora_training_client("tiny", rank=4, seed=SEED)
    state_path = tc.save_state("walk-state").result().path
    sampler_path = tc.save_weights_for_sampler("walk-sampler").result().path
    return Walk(server, sdk, tinker.RestClient(base_url=server.base_url, api_key=server.api_key), service, tc, local,
                state_path, sampler_path, sdk.create_sampling_client(model_path=sampler_path).result(),
                service.create_sampling_client(model_path=sampler_path), itertools.count())


# -- outcomes and recipes -------------------------------------------------------------------------------------------

Args = Callable[[Walk], tuple[tuple, dict]]


@dataclass(frozen=True)
class Works:
    args: Args
    check: Callable[[Walk, Any], None]
    note: str = ""
    on: Callable[[Walk], Any] | None = None
    """The client to call, when not the walk's shared one of the class (read after ``args`` ran)."""


@dataclass(frozen=True)
class Refused:
    args: Args
    pattern: str
    """A regular expression the error message must match: the method's name and the reason."""
    on: Callable[[Walk], Any] | None = None


@dataclass(frozen=True)
class SdkCannot:
    """The SDK's own client-side code fails, whatever the server answers: what it does cannot work for rlvr's
    models, and the row says why (and the README's table what to use instead)."""

    args: Args
    pattern: str
    why: str
    on: Callable[[Walk], Any] | None = None


Row = Works | Refused | SdkCannot


def call(*args: Any, **kwargs: Any) -> Args:
    return lambda w: (args, kwargs)


def sdk_local(kind: type | tuple[type, ...] | None) -> Callable[[Walk, Any], None]:
    """The check of a method the SDK answers without a request (console links, telemetry, handles)."""
    def check(w: Walk, value: Any) -> None:
        assert value is None if kind is None else isinstance(value, kind), value
    return check


def same_logprobs(sampler: Any, local_sampler: Any) -> None:
    prompt = types.ModelInput.from_ints(TOKENS)
    got, want = sampler.compute_logprobs(prompt).result(), local_sampler.compute_logprobs(prompt).result()
    assert got[0] is None and want[0] is None
    _close(got[1:], want[1:], "prompt logprobs")


def same_forward(remote: Any, local: Any) -> None:
    got, want = remote.forward(CE_DATA, "cross_entropy").result(), local.forward(CE_DATA, "cross_entropy").result()
    _close(got.metrics["loss:sum"], want.metrics["loss:sum"], "forward loss")


def same_output(got: types.ForwardBackwardOutput, want: types.ForwardBackwardOutput) -> None:
    assert set(got.metrics) == set(want.metrics)
    for key in want.metrics:
        _close(got.metrics[key], want.metrics[key], key)
    for g, lo in zip(got.loss_fn_outputs, want.loss_fn_outputs, strict=True):
        _close(g["logprobs"].to_numpy(), lo["logprobs"].to_numpy(), "logprobs")


def same_samples(got: types.SampleResponse, want: types.SampleResponse) -> None:
    assert [s.tokens for s in got.sequences] == [s.tokens for s in want.sequences]
    for g, lo in zip(got.sequences, want.sequences, strict=True):
        _close(g.logprobs, lo.logprobs, "sampled logprobs")


def tokenizer_matches(w: Walk, tokenizer: Any) -> None:
    text = "Hello world <|im_end|>"
    assert tokenizer.encode(text) == w.local.get_tokenizer().encode(text)


# ServiceClient ------------------------------------------------------------------------------------------------------


def close_args(w: Walk) -> tuple[tuple, dict]:
    """close() on a ServiceClient of its own with a live session; the check reads that session back as finished."""
    own = tinker.ServiceClient(base_url=w.server.base_url, api_key=w.server.api_key)
    own.create_sampling_client(base_model="tiny").result()
    w.closed = own, own.holder.get_session_id()  # type: ignore[attr-defined]
    return ("success",), {"detail": "walk"}


def check_closed(w: Walk, value: Any) -> None:
    own, session_id = w.closed  # type: ignore[attr-defined]
    found = w.rest.search_sessions(types.SessionSearchRequest(session_id=session_id)).result().sessions
    assert [(s.status.type, s.status.reason.type, s.status.detail) for s in found] == [
        ("client_finished", "success", "walk")], found
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="ServiceClient is closed"):
        own.create_sampling_client(base_model="tiny")
    assert time.monotonic() - started < PROMPT_S


def check_new_trainer(w: Walk, tc: Any) -> None:
    assert isinstance(tc, tinker.TrainingClient)
    same_forward(tc, w.service.create_lora_training_client("tiny", rank=2, seed=99))


def check_from_state(optimizer: bool) -> Callable[[Walk, Any], None]:
    def check(w: Walk, tc: Any) -> None:
        assert isinstance(tc, tinker.TrainingClient)
        make = (w.service.create_training_client_from_state_with_optimizer if optimizer
                else w.service.create_training_client_from_state)
        local = make(w.state_path)
        same_forward(tc, local)
        for client in (tc, local):  # one step: equal only when the optimizer state came back (or did not) alike
            client.forward_backward(CE_DATA, "cross_entropy").result()
            client.optim_step(ADAM).result()
        same_forward(tc, local)
    return check


def check_sampler_on_checkpoint(w: Walk, sampler: Any) -> None:
    assert isinstance(sampler, tinker.SamplingClient)
    same_logprobs(sampler, w.local_sampler)


def check_capabilities(w: Walk, value: Any) -> None:
    assert value == w.service.get_server_capabilities()


SERVICE: dict[str, Row] = {
    "close": Works(close_args, check_closed, on=lambda w: w.closed[0]),  # type: ignore[attr-defined]
    "copy_weights": Refused(lambda w: ((w.state_path,), {}), r"copy_weights is not supported: .*no projects",
                            on=lambda w: tinker.ServiceClient(project_id="walk", base_url=w.server.base_url,
                                                              api_key=w.server.api_key)),
    "create_custom_loss": Works(call(per_datum_neg_ll, {"logprobs": 1, "weights": 1}),
                                lambda w, handle: handle.loss_id is None or pytest.fail(handle),
                                "a client-side handle: client/config says custom_loss_server_side=false"),
    "create_lora_training_client": Works(call("tiny", rank=2, seed=99), check_new_trainer),
    "create_rest_client": Works(call(), lambda w, rest: rest.list_sessions().result()),
    "create_sampling_client": Works(lambda w: ((), {"model_path": w.sampler_path}), check_sampler_on_checkpoint),
    "create_training_client_from_state": Works(lambda w: ((w.state_path,), {}), check_from_state(False)),
    "create_training_client_from_state_with_optimizer": Works(lambda w: ((w.state_path,), {}),
                                                              check_from_state(True)),
    "get_console_url": Works(call(), sdk_local(str), "the SDK's link to Tinker's web console; no request"),
    "get_server_capabilities": Works(call(), check_capabilities),
    "get_telemetry": Works(call(), sdk_local((object, type(None))), "the SDK's own telemetry object; no request"),
}
SERVICE_TWINS = ["create_lora_training_client", "create_sampling_client", "create_training_client_from_state",
                 "create_training_client_from_state_with_optimizer", "get_server_capabilities"]


# TrainingClient -----------------------------------------------------------------------------------------------------


def check_forward(w: Walk, out: Any) -> None:
    same_output(out, w.local.forward(DATA, "importance_sampling").result())


def check_forward_backward(w: Walk, out: Any) -> None:
    same_output(out, w.local.forward_backward(DATA, "importance_sampling").result())


def check_custom(w: Walk, out: Any) -> None:
    want = w.local.forward_backward_custom(CE_DATA, neg_ll).result()
    _close(out.metrics["neg_ll:sum"], want.metrics["neg_ll:sum"], "custom loss")
    _close(out.metrics["neg_ll:sum"], w.local.forward(CE_DATA, "cross_entropy").result().metrics["loss:sum"],
           "custom loss = cross_entropy")


def check_optim_step(w: Walk, out: Any) -> None:
    w.local.forward_backward(CE_DATA, "cross_entropy").result()
    _close(out.metrics["grad_norm:mean"], w.local.optim_step(ADAM).result().metrics["grad_norm:mean"], "grad norm")
    same_forward(w.tc, w.local)


def optim_step_args(w: Walk) -> tuple[tuple, dict]:
    w.tc.forward_backward(CE_DATA, "cross_entropy").result()  # a gradient to step on (made on local in the check)
    return (ADAM,), {}


def check_info(w: Walk, info: Any) -> None:
    want = w.local.get_info()
    assert (info.model_id, info.lora_rank, info.model_name, info.is_lora) == (w.tc.model_id, 4, "tiny", True)
    assert (info.model_data.arch, info.model_data.model_name) == (want.model_data.arch, want.model_data.model_name)


def check_load(optimizer: bool) -> Callable[[Walk, Any], None]:
    def check(w: Walk, out: Any) -> None:
        assert out.path == w.state_path
        (w.local.load_state_with_optimizer if optimizer else w.local.load_state)(w.state_path).result()
        same_forward(w.tc, w.local)
    return check


def check_saved(kind: str) -> Callable[[Walk, Any], None]:
    def check(w: Walk, out: Any) -> None:
        assert out.path.startswith("tinker://") and f"/{kind}/walk-" in out.path, out.path
        listed = {c.tinker_path for c in w.rest.list_checkpoints(w.tc.model_id).result().checkpoints}
        assert out.path in listed
    return check


def check_snapshot(w: Walk, sampler: Any) -> None:
    assert isinstance(sampler, tinker.SamplingClient)
    local = w.local.save_weights_and_get_sampling_client()
    prompt = types.ModelInput.from_ints(PROMPT)
    same_samples(sampler.sample(prompt, 2, PARAMS).result(), local.sample(prompt, 2, PARAMS).result())


def check_external(w: Walk, out: Any) -> None:
    assert out.path.startswith("tinker://") and "/external_weights/walk-export-" in out.path, out
    urls = w.rest.get_external_weights_urls(out.path).result().urls
    assert "adapter_model.safetensors" in urls, urls


TRAINING: dict[str, Row] = {
    "create_sampling_client": Works(lambda w: ((w.sampler_path,), {}), check_sampler_on_checkpoint),
    "forward": Works(call(DATA, "importance_sampling"), check_forward),
    "forward_backward": Works(call(DATA, "importance_sampling"), check_forward_backward),
    "forward_backward_custom": Works(call(CE_DATA, neg_ll), check_custom, "runs in the SDK on the server's logprobs"),
    "get_console_url": Works(call(), sdk_local(str), "the SDK's link to Tinker's web console; no request"),
    "get_info": Works(call(), check_info),
    "get_telemetry": Works(call(), sdk_local((object, type(None))), "the SDK's own telemetry object; no request"),
    "get_tokenizer": Works(call(), tokenizer_matches, "a folder the server writes, loaded offline"),
    "load_state": Works(lambda w: ((w.state_path,), {}), check_load(False)),
    "load_state_with_optimizer": Works(lambda w: ((w.state_path,), {}), check_load(True)),
    "optim_step": Works(optim_step_args, check_optim_step),
    "save_state": Works(lambda w: ((w.name("walk-state"),), {}), check_saved("weights")),
    "save_weights_and_get_sampling_client": Works(call(), check_snapshot),
    "save_weights_external": Works(lambda w: ((w.name("walk-export"),), {}), check_external),
    "save_weights_for_sampler": Works(lambda w: ((w.name("walk-sampler"),), {}), check_saved("sampler_weights")),
}
TRAINING_TWINS = ["create_sampling_client", "forward", "forward_backward", "forward_backward_custom", "get_info",
                  "load_state", "load_state_with_optimizer", "optim_step", "save_state",
                  "save_weights_and_get_sampling_client", "save_weights_external", "save_weights_for_sampler"]


# SamplingClient -----------------------------------------------------------------------------------------------------


def check_compute_logprobs(w: Walk, got: Any) -> None:
    want = w.local_sampler.compute_logprobs(types.ModelInput.from_ints(TOKENS)).result()
    assert got[0] is None
    _close(got[1:], want[1:], "compute_logprobs")


def check_sample(w: Walk, got: Any) -> None:
    same_samples(got, w.local_sampler.sample(types.ModelInput.from_ints(PROMPT), 3, PARAMS).result())


def check_created(w: Walk, sampler: Any) -> None:
    if isinstance(sampler, APIFuture):
        sampler = sampler.result()
    check_sampler_on_checkpoint(w, sampler)


SAMPLING: dict[str, Row] = {
    "compute_logprobs": Works(call(types.ModelInput.from_ints(TOKENS)), check_compute_logprobs),
    "create": Works(lambda w: ((w.sdk.holder,), {"model_path": w.sampler_path}), check_created,
                    "the static constructor the other creation methods use"),
    "from_sampler_handle": Works(lambda w: ((w.sc.get_sampler_handle(),), {"api_key": w.server.api_key}),
                                 check_created),
    "get_base_model": Works(call(), lambda w, name: name == "tiny" or pytest.fail(name)),
    "get_sampler_handle": Works(call(), sdk_local(str), "encodes the sampler id and the base URL; no request"),
    "get_telemetry": Works(call(), sdk_local((object, type(None))), "the SDK's own telemetry object; no request"),
    "get_tokenizer": SdkCannot(call(), r"offline|huggingface\.co", "SDK 0.38 loads a sampler's tokenizer from the "
                               "Hugging Face hub by the base model's name, and rlvr's names (tiny, smollm2-135m) are "
                               "not hub repositories: it fails in this walk's process, whose hub is huggingface.co "
                               "(offline). A process started with HF_ENDPOINT=<server>/hf and HF_TOKEN=<key> gets "
                               "the engine's tokenizer from the server (test_server_tokenizer.py); "
                               "TrainingClient.get_tokenizer needs neither"),
    "on_queue_state_change": Works(call(QueueState.PAUSED_CAPACITY, "walk"), sdk_local(None),
                                   "the SDK's callback for queue states rlvr never reports; logs only"),
    "sample": Works(call(types.ModelInput.from_ints(PROMPT), 3, PARAMS), check_sample),
}
SAMPLING_TWINS = ["compute_logprobs", "get_base_model", "sample"]


# RestClient ---------------------------------------------------------------------------------------------------------


def listed(w: Walk, path: str) -> Any:
    return next((c for c in w.rest.list_checkpoints(w.tc.model_id).result().checkpoints if c.tinker_path == path),
                None)


def fresh_sampler_checkpoint(w: Walk) -> str:
    return w.tc.save_weights_for_sampler(w.name("walk-rest")).result().path


def delete_args(by_path: bool) -> Args:
    def args(w: Walk) -> tuple[tuple, dict]:
        path = fresh_sampler_checkpoint(w)
        w.deleted = path  # type: ignore[attr-defined]
        return ((path,) if by_path else (w.tc.model_id, "/".join(path.split("/")[-2:]))), {}
    return args


def check_deleted(w: Walk, value: Any) -> None:
    assert value is None and listed(w, w.deleted) is None  # type: ignore[attr-defined]


def flag_args(w: Walk) -> tuple[tuple, dict]:
    w.flagged = fresh_sampler_checkpoint(w)  # type: ignore[attr-defined]
    return (w.flagged,), {}  # type: ignore[attr-defined]


def check_public(public: bool) -> Callable[[Walk, Any], None]:
    def check(w: Walk, value: Any) -> None:
        if not public:  # unpublish a published checkpoint
            w.rest.publish_checkpoint_from_tinker_path(w.flagged).result()  # type: ignore[attr-defined]
            w.rest.unpublish_checkpoint_from_tinker_path(w.flagged).result()  # type: ignore[attr-defined]
        assert listed(w, w.flagged).public is public  # type: ignore[attr-defined]
    return check


def check_ttl(w: Walk, value: Any) -> None:
    assert listed(w, w.flagged).expires_at is not None  # type: ignore[attr-defined]


def check_signed_urls(w: Walk, out: Any) -> None:
    """The URLs download with a plain HTTP client (no key), byte for byte; a tampered one is refused (403)."""
    url = out.urls["adapter_model.safetensors"]
    _, _, _, _, run, _, kind, name, _, file = urlsplit(url).path.split("/")  # /api/v1/training_runs/<run>/...
    got = httpx.get(url, timeout=30)
    assert got.status_code == 200, got.text
    assert got.content == (checkpoint_root() / run / kind / name / file).read_bytes()
    tampered = httpx.get(url.replace("signature=", "signature=0"), timeout=30)
    assert tampered.status_code == 403 and "ask for a fresh URL" in tampered.json()["detail"], tampered.text


def check_run(w: Walk, run: Any) -> None:
    assert (run.base_model, run.lora_rank, run.is_lora) == ("tiny", 4, True)


def sampler_id_args(w: Walk) -> tuple[tuple, dict]:
    return (w.rest.get_session(w.session_id).result().sampler_ids[-1],), {}


REST: dict[str, Row] = {
    "assign_session_project": Refused(lambda w: ((w.session_id, "project"), {}),
                                      r"assign_session_project is not supported: rlvr serve has no projects"),
    "copy_weights": Refused(lambda w: ((w.state_path, "project"), {}), r"copy_weights is not supported: .*projects"),
    "delete_checkpoint": Works(delete_args(by_path=False), check_deleted),
    "delete_checkpoint_from_tinker_path": Works(delete_args(by_path=True), check_deleted),
    "export_session_trace": Refused(lambda w: ((w.session_id,), {}),
                                    r"export_session_trace is not supported: rlvr serve records no session traces"),
    "get_audit_log": Refused(call(), r"get_audit_log is not supported: rlvr serve keeps no audit log"),
    "get_billing_usage": Refused(call("2026-01-01", "2026-02-01"),
                                 r"get_billing_usage is not supported: rlvr serve does no billing"),
    "get_current_checkpoint_storage_usage": Works(call(), lambda w, u: u.data[0].size_bytes > 0 or pytest.fail(u)),
    "get_external_weights_urls": Works(lambda w: ((w.tc.save_weights_external(w.name("walk-url")).result().path,), {}),
                                       check_signed_urls, "signed: a plain HTTP client downloads them without the key"),
    "get_sampler": Works(sampler_id_args, lambda w, out: out.base_model == "tiny" or pytest.fail(out)),
    "get_server_capabilities": Works(call(), check_capabilities),
    "get_session": Works(lambda w: ((w.session_id,), {}),
                         lambda w, out: w.tc.model_id in out.training_run_ids or pytest.fail(out)),
    "get_telemetry": Works(call(), sdk_local((object, type(None))), "the SDK's own telemetry object; no request"),
    "get_training_run": Works(lambda w: ((w.tc.model_id,), {}), check_run),
    "get_training_run_by_tinker_path": Works(lambda w: ((w.state_path,), {}), check_run),
    "get_weights_info_by_tinker_path": Works(lambda w: ((w.state_path,), {}),
                                             lambda w, out: out.lora_rank == 4 or pytest.fail(out)),
    "list_checkpoints": Works(lambda w: ((w.tc.model_id,), {}),
                              lambda w, out: listed(w, w.state_path) or pytest.fail(out)),
    "list_sessions": Works(call(limit=1000), lambda w, out: w.session_id in out.sessions or pytest.fail(out)),
    "list_training_runs": Works(call(limit=1000), lambda w, out: out.training_runs or pytest.fail(out)),
    "list_user_checkpoints": Works(call(limit=1000), lambda w, out: w.state_path in {
        c.tinker_path for c in out.checkpoints} or pytest.fail(out)),
    "publish_checkpoint_from_tinker_path": Works(flag_args, check_public(True)),
    "search_sessions": Works(lambda w: ((types.SessionSearchRequest(session_id=w.session_id),), {}),
                             lambda w, out: [s.session_id for s in out.sessions] == [w.session_id] or pytest.fail(out)),
    "set_checkpoint_ttl_from_tinker_path": Works(lambda w: (flag_args(w)[0] + (3600,), {}), check_ttl),
    "unpublish_checkpoint_from_tinker_path": Works(flag_args, check_public(False)),
    "whoami": Refused(call(), r"whoami requires JWT"),  # the SDK answers it from a JWT rlvr never issues; no request
}
REST_TWINS = ["assign_session_project", "copy_weights", "delete_checkpoint", "delete_checkpoint_from_tinker_path",
              "export_session_trace", "get_audit_log", "get_billing_usage", "get_current_checkpoint_storage_usage",
              "get_external_weights_urls", "get_sampler", "get_session", "get_training_run",
              "get_training_run_by_tinker_path", "list_checkpoints", "list_sessions", "list_training_runs",
              "list_user_checkpoints", "publish_checkpoint_from_tinker_path", "set_checkpoint_ttl_from_tinker_path",
              "unpublish_checkpoint_from_tinker_path"]


def _with_twins(rows: dict[str, Row], twins: list[str]) -> dict[str, Row]:
    """The rows, plus each listed method's ``_async`` twin, called with the same recipe and held to the same outcome."""
    return {**rows, **{f"{name}_async": rows[name] for name in twins}}


TABLE: dict[type, dict[str, Row]] = {
    tinker.ServiceClient: _with_twins(SERVICE, SERVICE_TWINS),
    tinker.TrainingClient: _with_twins(TRAINING, TRAINING_TWINS),
    tinker.SamplingClient: _with_twins(SAMPLING, SAMPLING_TWINS),
    tinker.RestClient: _with_twins(REST, REST_TWINS),
}


# -- the walk -------------------------------------------------------------------------------------------------------


def sdk_methods(cls: type) -> set[str]:
    """The public methods of ``cls`` in the installed SDK: functions, coroutine functions and static methods (not
    properties such as the deprecated ``ServiceClient.holder``)."""
    return {name for name, member in inspect.getmembers(cls) if not name.startswith("_") and callable(member)
            and not isinstance(inspect.getattr_static(cls, name), property | type)}


def test_walk_table_covers_the_sdk():
    """Exactly the installed SDK's public methods have a row: a method a newer SDK adds fails here until covered."""
    for cls, rows in TABLE.items():
        assert set(rows) == sdk_methods(cls), (f"{cls.__name__}: missing rows {sorted(sdk_methods(cls) - set(rows))}, "
                                               f"rows for no method {sorted(set(rows) - sdk_methods(cls))}")


def _target(w: Walk, cls: type) -> Any:
    return {tinker.ServiceClient: w.sdk, tinker.TrainingClient: w.tc, tinker.SamplingClient: w.sc,
            tinker.RestClient: w.rest}[cls]


def _probe(w: Walk, cls: type, trainer: Any = None) -> None:
    """One cheap call on the client the row used (``trainer``, else the walk's), which must come back promptly."""
    if cls is tinker.ServiceClient:
        w.sdk.create_sampling_client(base_model="tiny").result()
    elif cls is tinker.TrainingClient:
        (trainer or w.tc).forward(CE_DATA, "cross_entropy").result()
    elif cls is tinker.SamplingClient:
        w.sc.compute_logprobs(types.ModelInput.from_ints(PROMPT)).result()
    else:
        w.rest.list_sessions(limit=1).result()


def _timed(fn: Callable[..., Any], *args: Any) -> float:
    started = time.monotonic()
    fn(*args)
    return time.monotonic() - started


def _invoke(method: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Calls ``method`` and resolves what it returns: a coroutine is run to the end (on a loop of its own, as a caller
    of an ``_async`` method would), a future to its value."""
    value = method(*args, **kwargs)
    if inspect.iscoroutine(value):
        async def run() -> Any:
            out = await value
            return await out if isinstance(out, APIFuture) else out
        return asyncio.run(run())
    return value.result() if isinstance(value, APIFuture) else value


ROWS = [(cls, name) for cls, rows in TABLE.items() for name in rows]


@pytest.mark.slow  # every SDK method through the server, each with its checks: about a minute in all
@pytest.mark.parametrize(("cls", "name"), ROWS, ids=[f"{c.__name__}.{n}" for c, n in ROWS])
def test_walk(walk, cls, name):
    _walk_row(walk, cls, name, TABLE[cls][name])


# Tinker's second optimizer: the same methods, called with Dimuon ------------------------------------------------------

DIMUON = types.DimuonOptimizerConfig()
DIMUON_STEP = types.DimuonParams(learning_rate=3e-2, beta1=0.8, grad_clip_norm=5.0)


def dimuon(w: Walk) -> tuple[Any, Any]:
    """A Dimuon training client through the SDK and its in-process twin, made once per walk."""
    if not hasattr(w, "dimuon"):
        w.dimuon = (w.sdk.create_lora_training_client(base_model="tiny", rank=4, seed=SEED, optimizer=DIMUON).result(),
                    w.service.create_lora_training_client("tiny", rank=4, seed=SEED, optimizer=DIMUON))
    return w.dimuon  # type: ignore[return-value]


def check_dimuon_trainer(w: Walk, tc: Any) -> None:
    assert tc.get_info().optimizer_config.type == "dimuon"
    same_forward(tc, w.service.create_lora_training_client("tiny", rank=2, seed=99, optimizer=DIMUON))


def dimuon_step_args(w: Walk) -> tuple[tuple, dict]:
    dimuon(w)[0].forward_backward(CE_DATA, "cross_entropy").result()
    return (DIMUON_STEP,), {}


def check_dimuon_step(w: Walk, out: Any) -> None:
    remote, local = dimuon(w)
    local.forward_backward(CE_DATA, "cross_entropy").result()
    _close(out.metrics["grad_norm:mean"], local.optim_step(DIMUON_STEP).result().metrics["grad_norm:mean"], "grad norm")
    same_forward(remote, local)


def dimuon_state_args(w: Walk) -> tuple[tuple, dict]:
    remote, local = dimuon(w)
    for client in (remote, local):  # a step, so the running averages saved are not zero
        client.forward_backward(CE_DATA, "cross_entropy").result()
        client.optim_step(DIMUON_STEP).result()
    w.dimuon_state = remote.save_state(w.name("walk-dimuon")).result().path  # type: ignore[attr-defined]
    return (w.dimuon_state,), {}  # type: ignore[attr-defined]


def check_dimuon_resumed(w: Walk, tc: Any) -> None:
    """The resumed client is Dimuon with the saved averages: its next step equals the uninterrupted twin's."""
    assert tc.get_info().optimizer_config.type == "dimuon"
    remote, twin = dimuon(w)
    for client in (tc, remote, twin):  # the saved client steps too, so the twins stay in step
        client.forward_backward(CE_DATA, "cross_entropy").result()
        client.optim_step(DIMUON_STEP).result()
    same_forward(tc, twin)
    same_forward(remote, twin)


def check_dimuon_weights_only(w: Walk, tc: Any) -> None:
    assert tc.get_info().optimizer_config.type == "dimuon"
    local = w.service.create_training_client_from_state(w.dimuon_state, optimizer=DIMUON)  # type: ignore[attr-defined]
    for client in (tc, local):
        client.forward_backward(CE_DATA, "cross_entropy").result()
        client.optim_step(DIMUON_STEP).result()
    same_forward(tc, local)


DIMUON_ROWS: dict[str, tuple[type, str, Row]] = {
    "create_lora_training_client(optimizer=DimuonOptimizerConfig())": (
        tinker.ServiceClient, "create_lora_training_client",
        Works(call("tiny", rank=2, seed=99, optimizer=DIMUON), check_dimuon_trainer)),
    "optim_step(DimuonParams)": (
        tinker.TrainingClient, "optim_step", Works(dimuon_step_args, check_dimuon_step, on=lambda w: dimuon(w)[0])),
    "optim_step(AdamParams) on a Dimuon client": (
        tinker.TrainingClient, "optim_step",
        Refused(call(ADAM), r"got types\.AdamParams, but this training client was created with "
                            r"optimizer=types\.DimuonOptimizerConfig\(\), which takes types\.DimuonParams",
                on=lambda w: dimuon(w)[0])),
    "optim_step(DimuonParams) on an AdamW client": (
        tinker.TrainingClient, "optim_step",
        Refused(call(DIMUON_STEP), r"got types\.DimuonParams, but this training client was created with "
                                   r"optimizer=types\.AdamOptimizerConfig\(\)")),
    "create_training_client_from_state_with_optimizer(a Dimuon state)": (
        tinker.ServiceClient, "create_training_client_from_state_with_optimizer",
        Works(dimuon_state_args, check_dimuon_resumed)),
    "create_training_client_from_state(a Dimuon state, optimizer=DimuonOptimizerConfig())": (
        tinker.ServiceClient, "create_training_client_from_state",
        Works(lambda w: (dimuon_state_args(w)[0], {"optimizer": DIMUON}), check_dimuon_weights_only)),
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(DIMUON_ROWS))
def test_walk_dimuon(walk, variant):
    """Each SDK method that takes or depends on the optimizer, called for Dimuon: held to the walk's outcomes."""
    cls, name, row = DIMUON_ROWS[variant]
    _walk_row(walk, cls, name, row)


def _walk_row(walk: Walk, cls: type, name: str, row: Row) -> None:
    args, kwargs = row.args(walk)
    method = getattr(row.on(walk) if row.on else _target(walk, cls), name)
    started = time.monotonic()
    if isinstance(row, Refused | SdkCannot):
        with pytest.raises(Exception, match=row.pattern):
            _invoke(method, args, kwargs)
    else:
        row.check(walk, _invoke(method, args, kwargs))
    refused_s = time.monotonic() - started
    trainer = method.__self__ if cls is tinker.TrainingClient else None
    next_s, steady_s = _timed(_probe, walk, cls, trainer), _timed(_probe, walk, cls, trainer)
    assert next_s < PROMPT_S + 2 * steady_s, f"the call after {name} took {next_s:.1f} s, the next {steady_s:.1f} s"
    if not isinstance(row, Works):
        assert refused_s < PROMPT_S + 2 * steady_s, f"{name} took {refused_s:.1f} s to fail"
    same_forward(walk.tc, walk.local)  # the in-process twin is still in step
