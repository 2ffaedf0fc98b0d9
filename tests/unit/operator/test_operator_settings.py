"""Operator settings: ENCODERPOOL_OPERATOR_* env, CLI flags on top, clear refusals."""

from __future__ import annotations

import pytest

from encoderpool_operator.cli import build_parser
from encoderpool_operator.settings import OperatorSettings, SettingsError, load_settings

pytestmark = pytest.mark.unit


def test_defaults_watch_all_namespaces() -> None:
    settings = load_settings(env={})
    assert settings.clusterwide and settings.namespaces == []
    assert settings.field_manager == "encoderpool-operator" and settings.resync_seconds == 60


def test_env_is_parsed() -> None:
    settings = load_settings(env={
        "ENCODERPOOL_OPERATOR_NAMESPACES": " ml, cv ,",
        "ENCODERPOOL_OPERATOR_RESYNC_SECONDS": "30",
        "ENCODERPOOL_OPERATOR_DEFAULT_IMAGE": "r/e:1",
        "ENCODERPOOL_OPERATOR_LOG_LEVEL": "debug",
    })
    assert settings.namespaces == ["ml", "cv"] and not settings.clusterwide
    assert (settings.resync_seconds, settings.default_image, settings.log_level) == (30, "r/e:1", "debug")


def test_flags_win_over_env() -> None:
    args = vars(build_parser().parse_args(["-n", "a", "--namespace", "b", "--resync-seconds", "15"]))
    settings = load_settings(cli=args, env={"ENCODERPOOL_OPERATOR_RESYNC_SECONDS": "30",
                                            "ENCODERPOOL_OPERATOR_NAMESPACES": "z"})
    assert settings.namespaces == ["a", "b"] and settings.resync_seconds == 15


def test_a_bad_value_names_the_variable_and_the_bound() -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(env={"ENCODERPOOL_OPERATOR_RESYNC_SECONDS": "1"})
    assert "ENCODERPOOL_OPERATOR_RESYNC_SECONDS / --resync-seconds" in str(caught.value)
    assert "ge 5" in str(caught.value)


def test_every_setting_has_a_flag_and_a_docstring() -> None:
    parser = build_parser()
    dests = {a.dest for a in parser._actions}
    for name, info in OperatorSettings.model_fields.items():
        assert name in dests, name
        assert info.description, name


def test_leader_election_flags_and_a_refused_timing() -> None:
    args = vars(build_parser().parse_args(["--leader-election", "false", "--lease-duration-seconds", "30"]))
    settings = load_settings(cli=args, env={})
    assert settings.leader_election is False and settings.lease_duration_seconds == 30
    with pytest.raises(SettingsError, match="invalid settings: leader election needs retry_period_seconds"):
        load_settings(env={"ENCODERPOOL_OPERATOR_RETRY_PERIOD_SECONDS": "12"})


def test_the_lease_identity_and_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    from encoderpool_operator.process import identity, lease_namespace

    monkeypatch.setenv("HOSTNAME", "op-7f9c-abcde")
    monkeypatch.setenv("POD_NAMESPACE", "encoderpool-system")
    first, second = identity(load_settings(env={})), identity(load_settings(env={}))
    assert first.startswith("op-7f9c-abcde_") and first != second, "unique per process, even in one pod"
    assert identity(load_settings(env={"ENCODERPOOL_OPERATOR_IDENTITY": "me"})) == "me"
    assert lease_namespace(load_settings(env={})) == "encoderpool-system"
    assert lease_namespace(load_settings(env={"ENCODERPOOL_OPERATOR_LEASE_NAMESPACE": "ops"})) == "ops"
    monkeypatch.delenv("POD_NAMESPACE")
    assert lease_namespace(load_settings(env={"ENCODERPOOL_OPERATOR_NAMESPACES": "ml"})) == "ml"


def test_the_environment_is_read_once_by_load_settings_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Values come from the env given to load_settings; validation never reads the process env again."""
    monkeypatch.setenv("ENCODERPOOL_OPERATOR_RESYNC_SECONDS", "33")
    monkeypatch.setenv("ENCODERPOOL_OPERATOR_DEFAULT_IMAGE", "from/process-env:1")
    assert load_settings().resync_seconds == 33, "the process env is the default source"
    given = load_settings(env={"ENCODERPOOL_OPERATOR_LOG_LEVEL": "debug"})
    assert (given.resync_seconds, given.default_image, given.log_level) == (60, "encoderpool/encoder-pod:0.1.0-cuda", "debug")
    assert OperatorSettings.model_validate({}) == load_settings(env={})


def test_an_unknown_field_is_refused_by_the_model() -> None:
    with pytest.raises(ValueError, match="resync_secs"):
        OperatorSettings.model_validate({"resync_secs": 5})
