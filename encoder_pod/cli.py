"""``encoder-pod``: serve an encoder, or write a tiny random-weight checkpoint."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from encoder_pod.settings import SettingsError, add_settings_arguments, load_settings, model_dir

EXIT_MODEL_LOAD = 3
"""Exit code when the model cannot be found: the operator reports such a pod as ModelLoadFailed."""

EXIT_BAD_SETTINGS = 2
"""Exit code when the settings cannot serve this model (e.g. --tp-size that its heads do not divide)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="encoder-pod", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve /encode over HTTP")
    add_settings_arguments(serve)
    tiny = sub.add_parser("make-tiny-model", help="write a random-weight checkpoint (offline)")
    tiny.add_argument("--arch", required=True, help="qwen2_vl, qwen2_5_vl, clip, siglip, llava_next, whisper, qwen2_audio")
    tiny.add_argument("--out", required=True, type=Path, help="output directory")
    tiny.add_argument("--preset", default="tiny", choices=["tiny", "moderate"], help="size of the checkpoint")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``encoder-pod`` command."""
    args = _parser().parse_args(argv)
    if args.command == "make-tiny-model":
        from encoder_pod.models.registry import make_tiny_model

        try:
            make_tiny_model(args.arch, args.out, preset=args.preset)
        except ValueError as exc:
            print(f"encoder-pod: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {args.arch} ({args.preset}) checkpoint to {args.out}")
        return 0
    settings = load_settings(cli=vars(args))
    try:
        model_dir(settings)
    except SettingsError as exc:
        print(f"encoder-pod: model load failed: {exc}", file=sys.stderr)
        return EXIT_MODEL_LOAD
    from encoder_pod.server import serve

    try:
        serve(settings)  # builds the engine first: a model the settings cannot serve is refused there
    except SettingsError as exc:
        print(f"encoder-pod: {exc}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    return 0


if __name__ == "__main__":
    sys.exit(main())
