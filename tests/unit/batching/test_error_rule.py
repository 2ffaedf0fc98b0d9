"""Only media errors are 400: a processor refusing the input blames the request, our own bugs are 500."""

from __future__ import annotations

import numpy as np
import pytest
from transformers.image_utils import infer_channel_dimension_format

from encoder_pod.batching.entry import as_encoder_error, raised_by_processor
from encoder_pod.errors import InternalError, InvalidRequest, MediaError

pytestmark = pytest.mark.unit


def _caught(fn) -> BaseException:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001
        return exc
    raise AssertionError("did not raise")


def _processor_refuses() -> None:
    infer_channel_dimension_format(np.zeros((2, 2)))  # transformers' own input check


def _our_bug() -> None:
    raise ValueError("shapes do not line up")


def test_a_value_error_from_the_processor_is_the_callers_400():
    exc = _caught(_processor_refuses)
    assert isinstance(exc, ValueError) and raised_by_processor(exc)
    err = as_encoder_error(exc, "preprocess")
    assert type(err) is InvalidRequest and err.http_status == 400 and "could not be preprocessed" in err.message


def test_a_value_error_of_our_own_code_is_a_500():
    exc = _caught(_our_bug)
    assert not raised_by_processor(exc)
    err = as_encoder_error(exc, "preprocess")
    assert type(err) is InternalError and err.http_status == 500 and "shapes do not line up" in err.message


def test_the_processor_rule_is_for_preprocess_only_and_media_errors_stay_as_they_are():
    assert type(as_encoder_error(_caught(_processor_refuses), "forward")) is InternalError
    media = MediaError("not an image")
    assert as_encoder_error(media, "preprocess") is media
    assert type(as_encoder_error(RuntimeError("boom"), "preprocess")) is InternalError
