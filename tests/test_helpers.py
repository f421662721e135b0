"""The shared assertion itself must be able to fail."""

import numpy as np
import pytest
from helpers import assert_close


def test_assert_close_fails_on_nan():
    with pytest.raises(AssertionError, match="NaN"):
        assert_close(np.array([1.0, np.nan]), np.array([1.0, 2.0]), 1e-3, 1e-3)


def test_assert_close_fails_on_error_and_shape():
    with pytest.raises(AssertionError, match="max abs err"):
        assert_close(np.array([1.0, 2.1]), np.array([1.0, 2.0]), 1e-3, 1e-3)
    with pytest.raises(AssertionError, match="shape"):
        assert_close(np.zeros(3), np.zeros(4), 1e-3, 1e-3)


def test_assert_close_passes_within_bound():
    assert_close(np.array([1.0, 2.0 + 1e-5]), np.array([1.0, 2.0]), 1e-4, 0.0)
