"""``encoder-pod``: serve an encoder, fetch a model's encoder files, or write a tiny random checkpoint.

The one place where errors become exit codes (:class:`~encoder_pod.exitcodes.ExitCode`): a bad
setting is ``BAD_SETTINGS`` (2), a model path without a checkpoint (or a hub id that cannot be
resolved) ``MODEL_LOAD_FAILED`` (3), and so is a checkpoint no path of this pod can serve (an unknown
architecture, remote code only, a processor that needs torchvision): refused before the server
starts, never left up unready; and so is a model whose load fails once the server runs (the server
stops at once; behind a data-parallel front, once a worker refused the checkpoint or a rank was
given up).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from encoder_pod.exitcodes import ExitCode
from encoder_pod.models.families import default_registry  # no torch: config.json facts only
from encoder_pod.settings import EncoderSettings, ModelPathError, SettingsError, add_settings_arguments, load_settings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="encoder-pod", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve /encode over HTTP")
    add_settings_arguments(serve)
    tiny = sub.add_parser("make-tiny-model", help="write a random-weight checkpoint (offline)")
    tiny.add_argument("--arch", required=True, help=", ".join(default_registry().names()))
    tiny.add_argument("--out", required=True, type=Path, help="output directory")
    tiny.add_argument("--preset", default="tiny", choices=["tiny", "moderate"], help="size of the checkpoint")
    tiny.add_argument(
        "--full", action="store_true",
        help="a whole ...ForConditionalGeneration checkpoint (language model included, sharded with an index) "
        "instead of the encoder tower alone",
    )
    fetch = sub.add_parser(
        "fetch-model",
        help="download a hub model's config, processor files and only the shards holding its encoder "
        "into the Hugging Face cache (nothing when the cache already has them)",
    )
    fetch.add_argument("model", help="hf://org/name[@revision] or org/name[@revision]")
    fetch.add_argument("--revision", default=None, help="branch, tag or commit (same as @revision)")
    fetch.add_argument("--cache-dir", default=None, help="hub cache directory (default: $HF_HUB_CACHE or $HF_HOME/hub)")
    return parser


def _make_tiny_model(args: argparse.Namespace) -> int:
    from encoder_pod.models.family import Layout
    from encoder_pod.models.registry import make_tiny_model

    layout = Layout.FULL if args.full else None
    try:
        make_tiny_model(args.arch, args.out, preset=args.preset, layout=layout)
    except ValueError as exc:
        print(f"encoder-pod: {exc}", file=sys.stderr)
        return ExitCode.BAD_SETTINGS
    kind = "whole" if args.full else "encoder"
    print(f"wrote {args.arch} ({args.preset}, {kind}) checkpoint to {args.out}")
    return ExitCode.OK


def _encoder_keys(model_dir: Path, keys: list[str]) -> list[str]:
    """The family code's key plan, imported (with torch) only once a config.json is there."""
    from encoder_pod.models.registry import encoder_weight_keys

    return encoder_weight_keys(model_dir, keys)


def _fetch_model(args: argparse.Namespace) -> int:
    from encoder_pod.models.hub import fetch, parse_spec

    try:
        snapshot = fetch(parse_spec(args.model, args.revision), _encoder_keys, cache_dir=args.cache_dir)
    except ModelPathError as exc:
        print(f"encoder-pod: fetch failed: {exc}", file=sys.stderr)
        return ExitCode.MODEL_LOAD_FAILED
    except SettingsError as exc:
        print(f"encoder-pod: {exc}", file=sys.stderr)
        return ExitCode.BAD_SETTINGS
    print(snapshot)
    return ExitCode.OK


def _resolved(settings: EncoderSettings) -> EncoderSettings:
    """``settings`` with a hub id model path replaced by its snapshot folder (workers get a directory)."""
    from encoder_pod.models.hub import resolve_model_dir

    path = resolve_model_dir(settings.model, _encoder_keys)
    if str(path) == settings.model.model_path:
        return settings
    model = settings.model.model_copy(update={"model_path": str(path)})
    return settings.model_copy(update={"model": model})


def _refuse_unservable(settings: EncoderSettings) -> None:
    """Raise :class:`~encoder_pod.models.servable.CheckpointRefused` when no path of this pod serves the model."""
    from encoder_pod.models.servable import refusal

    refused = refusal(Path(settings.model.model_path), default_registry())
    if refused is not None:
        raise refused


def _exit_now(message: str, code: ExitCode) -> NoReturn:
    """Print ``message`` as the process's last line and exit with ``code``, skipping interpreter teardown.

    Once a model was loaded, the teardown prints native extensions' leak reports (nanobind's, for
    triton's types) after anything printed here, and the kubelet quotes a failed container's last
    lines as its termination message: they must be this one. Nothing is left to clean up (the
    server and the engine have stopped), so nothing is lost by not tearing down.
    """
    import logging
    import os

    logging.shutdown()
    print(" ".join(message.splitlines()), file=sys.stderr)  # one line: the operator quotes the last one
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _serve(args: argparse.Namespace) -> int:
    from encoder_pod.errors import ModelLoadFailed
    from encoder_pod.models.servable import CheckpointRefused

    try:
        settings = _resolved(load_settings(cli=vars(args)))
        _refuse_unservable(settings)  # at once: not after the imports and a background load
        from encoder_pod.server import serve

        try:
            serve(settings)  # builds the engine first: a model the settings cannot serve is refused there
        except ModelLoadFailed as exc:  # the load failed: the server (and any worker) has stopped
            _exit_now(f"encoder-pod: model load failed: {exc.message}", ExitCode.MODEL_LOAD_FAILED)
    except (ModelPathError, CheckpointRefused) as exc:
        print(f"encoder-pod: model load failed: {exc}", file=sys.stderr)
        return ExitCode.MODEL_LOAD_FAILED
    except SettingsError as exc:
        print(f"encoder-pod: {exc}", file=sys.stderr)
        return ExitCode.BAD_SETTINGS
    return ExitCode.OK


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``encoder-pod`` command; returns its exit code."""
    args = _parser().parse_args(argv)
    if args.command == "make-tiny-model":
        return _make_tiny_model(args)
    if args.command == "fetch-model":
        return _fetch_model(args)
    return _serve(args)


if __name__ == "__main__":
    sys.exit(main())
