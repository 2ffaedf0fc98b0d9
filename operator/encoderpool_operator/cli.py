"""``encoderpool-operator``: run the EncoderPool operator.

Every flag mirrors an ``ENCODERPOOL_OPERATOR_*`` variable (see settings.py); the flag wins.
"""

from __future__ import annotations

import argparse
from typing import Sequence

from encoderpool_operator.settings import ENV_PREFIX, OperatorSettings, load_settings


def build_parser() -> argparse.ArgumentParser:
    """One flag per settings field, plus --namespace (repeatable) for the namespaces list."""
    parser = argparse.ArgumentParser(
        prog="encoderpool-operator",
        description="Run the EncoderPool operator (all namespaces unless --namespace is given).",
    )
    for name, info in OperatorSettings.model_fields.items():
        env = ENV_PREFIX + name.upper()
        if name == "namespaces":
            parser.add_argument(
                "-n", "--namespace", dest="namespaces", action="append", default=None,
                help=f"Namespace to watch; repeat for several (default: all) [env {env}, comma separated]",
            )
            continue
        parser.add_argument("--" + name.replace("_", "-"), dest=name, default=None, help=f"{info.description} [env {env}]")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """Parse settings, then hand over to kopf (imported only now: --help needs no cluster libs)."""
    args = vars(build_parser().parse_args(argv))
    settings = load_settings(cli=args)
    from encoderpool_operator import process

    process.run(settings)


if __name__ == "__main__":
    main()
