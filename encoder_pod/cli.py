"""``encoder-pod``: serve an encoder, or write a tiny random-weight checkpoint.

The one place where errors become exit codes (:class:`~encoder_pod.exitcodes.ExitCode`): a bad
setting is ``BAD_SETTINGS`` (2), a model path without a checkpoint ``MODEL_LOAD_FAILED`` (3).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from encoder_pod.exitcodes import ExitCode
from encoder_pod.models.families import default_registry  # no torch: config.json facts only
from encoder_pod.settings import ModelPathError, SettingsError, add_settings_arguments, load_settings, model_dir


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="encoder-pod", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve /encode over HTTP")
    add_settings_arguments(serve)
    tiny = sub.add_parser("make-tiny-model", help="write a random-weight checkpoint (offline)")
    tiny.add_argument("--arch", required=True, help=", ".join(default_registry().names()))
    tiny.add_argument("--out", required=True, type=Path, help="output directory")
    tiny.add_argument("--preset", default="tiny", choices=["tiny", "moderate"], help="size of the checkpoint")
    return parser


def _make_tiny_model(args: argparse.Namespace) -> int:
    from encoder_pod.models.registry import make_tiny_model

    try:
        make_tiny_model(args.arch, args.out, preset=args.preset)
    except ValueError as exc:
        print(f"encoder-pod: {exc}", file=sys.stderr)
        return ExitCode.BAD_SETTINGS
    print(f"wrote {args.arch} ({args.preset}) checkpoint to {args.out}")
    return ExitCode.OK


def _serve(args: argparse.Namespace) -> int:
    try:
        settings = load_settings(cli=vars(args))
        model_dir(settings.model)
        from encoder_pod.server import serve

        serve(settings)  # builds the engine first: a model the settings cannot serve is refused there
    except ModelPathError as exc:
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
    return _serve(args)


if __name__ == "__main__":
    sys.exit(main())
