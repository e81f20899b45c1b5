"""Supervised fine-tuning (SFT) with OpenPipe ART's own client against tandem.

ART's `ServerlessBackend` starts an SFT job in three steps:

1. it writes the trajectories to a JSONL file, one `{"messages": [...], "tools"?: [...]}` a line;
2. it uploads that file to W&B as a dataset artifact named `<run name>-sft-data-<12 hex>`
   (three calls of the wandb SDK: `init`, `Artifact`/`artifact`, `Settings`/`settings`);
3. it posts `/v1/preview/sft-training-jobs` with
   `training_data_url = "wandb-artifact:///<entity>/<project>/<artifact name>:v0"` and follows the
   job's events at `/v1/preview/training-jobs/<id>/events`.

Only step 2 needs W&B. tandem keeps datasets itself: `POST /v1/preview/datasets?project=P&name=N`
with the raw JSONL file as the body stores it under `wandb-artifact:///<entity>/P/N:v0` (the entity
is the API key's) and answers `{"id", "entity", "project", "name", "version", "url", "num_rows",
"size_bytes", "created_at"}`. This module offers two ways to use that:

* `tandem_sft_uploads(backend)` swaps ART's W&B upload for an upload to tandem, so ART's own
  `model.train_sft(...)` (and `art.utils.sft.train_sft_from_file`) work unchanged::

      backend = art.ServerlessBackend(base_url="http://127.0.0.1:8000/v1", api_key=KEY)
      await model.register(backend)
      with tandem_sft_uploads(backend):
          await model.train_sft(trajectories, config=art.TrainSFTConfig(learning_rate=1e-4, batch_size=2))

  Use it as a context manager around the SFT calls, or call `.install()` once (and `.uninstall()`
  to restore). Only ART's SFT upload is replaced: other wandb calls (e.g. a W&B run for metrics
  when `WANDB_API_KEY` is set) go to the real SDK. It works with openpipe-art 0.5.18 (which calls
  `wandb.init/Artifact/Settings`; the `wandb` package must be installed) and 0.5.23 (which calls
  them through `art.utils.wandb_sdk`; no `wandb` package needed).

* `sft_from_file(backend, model, "train.jsonl", learning_rate=..., batch_size=...)` uploads a JSONL
  file you already have and runs one SFT job on it through ART's API client, following the job's
  events the way ART does; it returns the per-step metrics and the model's new step.

Keep `WANDB_API_KEY` unset unless you want ART to report to W&B as well.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import Any

__all__ = [
    "DatasetUploadError",
    "SFTResult",
    "dataset_url",
    "sft_from_file",
    "tandem_sft_uploads",
    "upload_dataset",
]


class DatasetUploadError(RuntimeError):
    """tandem refused a dataset upload; `status` and `body` are its answer."""

    def __init__(self, message: str, status: int | None = None, body: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.body = body


def _base_url(backend: Any) -> str:
    # ServerlessBackend keeps the API root it was given (".../v1/"); every preview route hangs off it.
    return str(getattr(backend, "_base_url", None) or backend._client.base_url).rstrip("/")


def dataset_url(entity: str, project: str, name: str) -> str:
    """The `training_data_url` ART builds for a dataset artifact (always version 0)."""
    return f"wandb-artifact:///{entity}/{project}/{name}:v0"


def upload_dataset(backend: Any, project: str, name: str, data: bytes, *, timeout: float = 300) -> dict[str, Any]:
    """Store `data` (JSONL) in tandem as dataset `project/name`; returns tandem's answer.

    Blocking (like the wandb upload it replaces). Raises `DatasetUploadError` on any non-2xx answer;
    a 404 from a tandem without the datasets route says so plainly.
    """
    query = urllib.parse.urlencode({"project": project, "name": name})
    url = f"{_base_url(backend)}/preview/datasets?{query}"
    request = urllib.request.Request(
        url,
        data=data,
        method="POST",
        headers={
            "Authorization": f"Bearer {backend._client.api_key}",
            "Content-Type": "application/jsonl",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.load(response)
    except urllib.error.HTTPError as error:
        body = error.read().decode("utf-8", "replace")
        if error.code == 404:  # the route names no object, so a 404 means the route is missing
            message = (
                f"POST {url} answered 404 {body!r}: this tandem server has no datasets route, so it "
                "cannot take SFT data (update tandem)"
            )
        else:
            message = f"POST {url} answered {error.code}: {body}"
        raise DatasetUploadError(message, error.code, body) from None


# --- the stand-ins for ART's three wandb calls --------------------------------------------------


class _UploadSettings:
    """What `settings(api_key=...)` returns for ART's SFT upload: marks the `init` call as ours."""

    def __init__(self, api_key: str | None) -> None:
        self.api_key = api_key


class _DatasetArtifact:
    """ART's `artifact(name, type="dataset", metadata=...)`: remembers the file ART adds."""

    def __init__(self, name: str, type: str | None = None, metadata: dict | None = None, **_: Any) -> None:
        self.name = name
        self.type = type
        self.metadata = dict(metadata or {})
        self.local_path: str | None = None
        self.dataset: dict[str, Any] | None = None

    def add_file(self, local_path: str, name: str | None = None, **_: Any) -> None:
        if self.local_path is not None:
            raise RuntimeError("tandem datasets hold one JSONL file; ART added a second one")
        self.local_path = local_path

    def wait(self, *_: Any, **__: Any) -> "_DatasetArtifact":
        return self


class _UploadRun:
    """ART's `init(...)` for the upload: `log_artifact` posts the JSONL file to tandem."""

    def __init__(self, uploads: "tandem_sft_uploads", entity: str | None, project: str) -> None:
        self._uploads = uploads
        self.entity = entity
        self.project = project

    def log_artifact(self, artifact: _DatasetArtifact, *_: Any, **__: Any) -> _DatasetArtifact:
        if artifact.local_path is None:
            raise RuntimeError("ART logged a dataset artifact without a file")
        with open(artifact.local_path, "rb") as f:
            data = f.read()
        answer = upload_dataset(self._uploads.backend, self.project, artifact.name, data)
        # ART will name the data by the URL it builds itself; make sure tandem stored it there.
        expected = dataset_url(self.entity or answer.get("entity", ""), self.project, artifact.name)
        if answer.get("url") != expected:
            raise DatasetUploadError(
                f"tandem stored the dataset as {answer.get('url')!r} but ART will ask for {expected!r}"
            )
        artifact.dataset = answer
        self._uploads.datasets.append(answer)
        return artifact

    def finish(self, *_: Any, **__: Any) -> None:
        pass


class tandem_sft_uploads:
    """Make ART's `model.train_sft` upload its SFT data to tandem instead of W&B.

    `with tandem_sft_uploads(backend): ...` or `uploads = tandem_sft_uploads(backend).install()`.
    `datasets` lists tandem's answers for the datasets uploaded while installed.
    """

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.datasets: list[dict[str, Any]] = []
        self._saved: list[tuple[Any, str, Any]] = []

    # The replacements delegate every call that is not ART's SFT upload to the real functions.
    def _settings(self, real: Any) -> Any:
        def settings(*args: Any, **kwargs: Any) -> Any:
            if not args and set(kwargs) == {"api_key"}:  # ART's SFT upload: settings(api_key=...)
                return _UploadSettings(kwargs["api_key"])
            return real(*args, **kwargs)

        return settings

    def _init(self, real: Any) -> Any:
        def init(*args: Any, **kwargs: Any) -> Any:
            if isinstance(kwargs.get("settings"), _UploadSettings):
                return _UploadRun(self, kwargs.get("entity"), kwargs["project"])
            return real(*args, **kwargs)

        return init

    def _artifact(self, real: Any) -> Any:
        def artifact(*args: Any, **kwargs: Any) -> Any:
            name = args[0] if args else kwargs.get("name", "")
            if kwargs.get("type") == "dataset" and "-sft-data-" in str(name):
                return _DatasetArtifact(*args, **kwargs)
            return real(*args, **kwargs)

        return artifact

    def _targets(self) -> list[tuple[Any, str, str]]:
        """(module, attribute, kind) of each wandb entry point ART's SFT upload goes through."""
        targets: list[tuple[Any, str, str]] = []
        try:  # openpipe-art >= 0.5.19 or so: lazy wrappers in art.utils.wandb_sdk
            from art.utils import wandb_sdk  # type: ignore[attr-defined]
        except ImportError:
            wandb_sdk = None
        if wandb_sdk is not None and hasattr(wandb_sdk, "init"):
            targets += [(wandb_sdk, "init", "init"), (wandb_sdk, "artifact", "artifact"),
                        (wandb_sdk, "settings", "settings")]
        else:  # openpipe-art 0.5.18: `import wandb` inside ServerlessBackend._train_sft
            try:
                import wandb
            except ImportError as error:
                raise RuntimeError(
                    "this openpipe-art uploads SFT data through the wandb package; install it "
                    "(e.g. wandb==0.25.0) so its calls can be redirected to tandem"
                ) from error
            targets += [(wandb, "init", "init"), (wandb, "Artifact", "artifact"), (wandb, "Settings", "settings")]
        return targets

    def install(self) -> "tandem_sft_uploads":
        if self._saved:
            return self
        for module, attribute, kind in self._targets():
            real = getattr(module, attribute)
            self._saved.append((module, attribute, real))
            setattr(module, attribute, getattr(self, "_" + kind)(real))
        return self

    def uninstall(self) -> None:
        while self._saved:
            module, attribute, real = self._saved.pop()
            setattr(module, attribute, real)

    def __enter__(self) -> "tandem_sft_uploads":
        return self.install()

    def __exit__(self, *_: Any) -> None:
        self.uninstall()


# --- SFT on a JSONL file you already have -------------------------------------------------------


@dataclasses.dataclass
class SFTResult:
    job_id: str
    dataset: dict[str, Any]  # tandem's answer to the upload
    metrics: list[dict[str, float]]  # one per gradient step, named as ART names them
    num_batches: int  # `num_sequences` of the job's training_started event
    step: int  # the model's latest step after the job
    seconds: float


def _canonical(metrics: dict[str, float]) -> dict[str, float]:
    try:  # the names ART gives upstream metrics (loss -> loss/train, ...), when available
        from art.serverless.backend import _canonicalize_upstream_metrics
    except ImportError:
        return metrics
    return _canonicalize_upstream_metrics(metrics)


async def sft_from_file(
    backend: Any,
    model: Any,
    path: str | os.PathLike[str],
    *,
    learning_rate: float | list[float] = 5e-5,
    batch_size: int | None = None,
    assistant_turns: str | None = None,
    name: str | None = None,
    timeout: float | None = None,
    poll_interval: float = 1.0,
) -> SFTResult:
    """Upload the JSONL file at `path` to tandem and run one SFT job on it for `model`.

    `model` must be registered with `backend` (an `art.ServerlessBackend` pointed at tandem).
    Each line of the file is `{"messages": [...], "tools"?: [...]}`. `learning_rate` is one value
    or one per batch; `batch_size=None` and `assistant_turns=None` leave the server's defaults.
    The dataset is named `name`, by default `<run name>-sft-data-<12 hex>` as ART names it.
    Raises `DatasetUploadError` if the upload is refused and `RuntimeError` if the job fails or
    `timeout` seconds pass without its end.
    """
    from openai._types import NOT_GIVEN

    if getattr(model, "id", None) is None:
        raise ValueError("register the model first: await model.register(backend)")
    started = time.monotonic()
    storage_name = getattr(model, "run_name", None) or model.name  # 0.5.23: run_name; 0.5.18: name
    name = name or f"{storage_name}-sft-data-{uuid.uuid4().hex[:12]}"
    with open(path, "rb") as f:
        data = f.read()
    dataset = await asyncio.to_thread(upload_dataset, backend, model.project, name, data)

    config: dict[str, Any] = {"learning_rate": learning_rate}
    if batch_size is not None:
        config["batch_size"] = batch_size
    if assistant_turns is not None:
        config["assistant_turns"] = assistant_turns
    job = await backend._client.sft_training_jobs.create(
        model_id=model.id, training_data_url=dataset["url"], config=config
    )

    # Follow the events as ART does: `after` advances past every event but training_started.
    after: str | None = None
    num_batches = 0
    metrics: list[dict[str, float]] = []
    while True:
        if timeout is not None and time.monotonic() - started > timeout:
            raise RuntimeError(f"SFT job {job.id} did not end within {timeout:.0f}s")
        await asyncio.sleep(poll_interval)
        async for event in backend._client.sft_training_jobs.events.list(
            training_job_id=job.id, after=after or NOT_GIVEN
        ):
            if event.type == "training_started":
                num_batches = int(event.data.get("num_sequences", 0))
                continue
            if event.type == "gradient_step":
                metrics.append(_canonical({k: float(v) for k, v in event.data.items()}))
            elif event.type == "training_ended":
                step = await backend._get_step(model)
                return SFTResult(job.id, dataset, metrics, num_batches, step, time.monotonic() - started)
            elif event.type == "training_failed":
                message = event.data.get("error_message", "SFT training failed with an unknown error")
                raise RuntimeError(f"SFT training job {job.id} failed: {message}")
            after = event.id
