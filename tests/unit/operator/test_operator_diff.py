"""When a child needs no write: the hash of what we would apply, and the values we own, as live."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from encoderpool_operator.children import stamped
from encoderpool_operator.diff import contains, first_difference, up_to_date, without

pytestmark = pytest.mark.unit

WANT = stamped({
    "apiVersion": "v1", "kind": "Service", "metadata": {"name": "enc", "labels": {"a": "b"}},
    "spec": {"clusterIP": "None", "publishNotReadyAddresses": False,
             "ports": [{"name": "http", "port": 30000, "targetPort": "http"}]},
})


def live_copy() -> dict[str, Any]:
    """The object as the API server returns it: defaults filled, false values omitted."""
    live = copy.deepcopy(WANT)
    live["metadata"].update(uid="u", resourceVersion="7", managedFields=[{"manager": "x"}])
    live["spec"].pop("publishNotReadyAddresses")  # omitempty false
    live["spec"].update(clusterIPs=["None"], sessionAffinity="None", type="ClusterIP")
    live["spec"]["ports"][0]["protocol"] = "TCP"
    return live


def test_an_unchanged_child_is_up_to_date() -> None:
    assert up_to_date(live_copy(), WANT)


def test_a_hand_edit_of_an_owned_field_is_not() -> None:
    live = live_copy()
    live["spec"]["ports"][0]["port"] = 8080
    assert not up_to_date(live, WANT)
    live = live_copy()
    live["spec"]["publishNotReadyAddresses"] = True
    assert not up_to_date(live, WANT)


def test_a_changed_manifest_is_not_even_when_everything_we_set_is_there() -> None:
    """A removed env var or port leaves the old values live; only the hash says so."""
    live = live_copy()
    fewer = stamped({**WANT, "metadata": {"name": "enc", "labels": {"a": "b"}},
                     "spec": {**WANT["spec"], "ports": []}})
    assert contains(live, {k: v for k, v in fewer.items() if k != "metadata"})
    assert not up_to_date(live, fewer)


def test_a_missing_child_is_not() -> None:
    assert not up_to_date(None, WANT)


@pytest.mark.parametrize(
    ("live", "want", "same"),
    [
        ("2Gi", 2147483648, True),
        ("1", "1000m", True),
        ("4", 4, True),
        ("4", 5, False),
        (None, {}, True),
        (None, [], True),
        (["a", "b"], ["a", "b"], True),
        (["b", "a"], ["a", "b"], False),
        ([{"name": "x", "v": 1, "extra": 2}], [{"name": "x", "v": 1}], True),
        ([{"name": "x", "v": 2}], [{"name": "x", "v": 1}], False),
    ],
)
def test_contains(live: Any, want: Any, same: bool) -> None:
    assert contains(live, want) is same


def test_known_dropped_fields_can_be_ignored() -> None:
    want = stamped({"kind": "StatefulSet", "metadata": {"name": "enc"},
                    "spec": {"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2}}}})
    live = copy.deepcopy(want)
    del live["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"]
    path = ("spec", "updateStrategy", "rollingUpdate", "maxUnavailable")
    assert not up_to_date(live, want)
    assert up_to_date(live, want, (path,))
    assert "maxUnavailable" in want["spec"]["updateStrategy"]["rollingUpdate"], "without() copies"
    assert without(want, (path,))["spec"]["updateStrategy"]["rollingUpdate"] == {}


def test_the_first_difference_names_the_field() -> None:
    live = live_copy()
    live["spec"]["ports"][0]["port"] = 8080
    assert first_difference(live, WANT) == ".spec.ports[0].port"
    assert first_difference(live_copy(), WANT) is None
